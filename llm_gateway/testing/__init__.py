"""Test doubles shipped with the package (as mitmproxy ships mitmproxy/test/): the fake
upstream the suite, the demo and the benchmarks run against, and a record sink."""
