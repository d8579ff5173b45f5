"""`quanta bench`: drive a running OpenAI-compatible server and measure it."""
