"""`albert-dist serve`: a trained model behind HTTP on Ray Serve.

protocol: the JSON a request carries and its answer · auth: the bearer token · deployment: the Ray Serve
deployment (one model per replica, requests batched) · server: the foreground command (Ray, Serve, the token, Ctrl-C).
"""
