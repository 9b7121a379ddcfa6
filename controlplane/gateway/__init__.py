"""The HTTP gateway (`galaxy serve gateway`): the public request path for
clients we did not write (curl, browsers, OpenAI and KServe clients). It
routes by path or Host header to a function, gets a slot from the owning
Dispatch instance, proxies the request and streams the answer back, and
releases the slot when the answer ends or the client goes away
(docs/gateway.md)."""
