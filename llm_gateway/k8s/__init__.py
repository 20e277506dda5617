"""The pod-injection webhook (one module for now)."""
