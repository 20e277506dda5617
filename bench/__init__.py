"""The benchmark harness: the gateway's overhead against direct calls and against LiteLLM.

``python -m bench.run`` (or ``make bench``) starts the fake upstream and every target as its
own process, measures them one after the other on this machine, and writes a table, a JSON
file and a PNG chart. See docs/performance.md.
"""
