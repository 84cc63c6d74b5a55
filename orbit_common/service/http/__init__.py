"""HTTP plumbing shared by every daemon that serves HTTP (the API and the dispatcher).

Strict body and query reading (:mod:`.body`), RFC 9457 problem documents (:mod:`.problems`),
the typed application and request keys (:mod:`.context`), the middlewares — metrics, request
id, problem documents for every error, bearer authentication (:mod:`.middleware`) — and the
application builder and runner whose connections answer even the HTTP parser's refusals as
problem documents (:mod:`.server`). Part of the kernel: it knows no domain. Authentication is
given to it as a function (the platform's ``orbit_common.platform.principals.authenticate``).
"""
