"""The HTTP/1.1 server of the sidecar: connections, parsed by llhttp (httptools) and bounded in
every way a hostile client could push.

llhttp, the parser of Node.js, runs in its strict mode (httptools' default: no
leniency enabled): it refuses control bytes, NUL and bare CR in the request
line and fields, obsolete line folding, malformed or duplicate
``Content-Length``, ``Content-Length`` next to ``Transfer-Encoding``, and
invalid chunk framing.  On top of it this module refuses, as nginx does, an
HTTP/1.1 request without exactly one ``Host``, ``Transfer-Encoding`` on
HTTP/1.0, ``CONNECT`` (405) and targets other than origin-form and
absolute-form (400; absolute-form is taken by its path).

Bounds, each with its own answer:

* a request head must arrive whole within ``header_timeout`` of its first byte
  (nginx's ``client_header_timeout``; 408 and close) and within ``max_head``
  bytes (431);
* a body must keep moving: ``body_timeout`` between two reads (408);
* an idle keep-alive connection is closed after ``keepalive_timeout``;
* answers must keep leaving: a connection whose unsent answers make no
  progress for ``send_timeout`` (nginx's ``send_timeout``) is aborted, which
  frees its descriptor and buffers at once (a plain close would wait for the
  client to read them);
* at most ``max_pipeline`` requests are queued on a connection, counting the one
  being answered: a read is parsed in pieces too short to complete more request
  heads than there is room for, and what does not fit waits, unparsed, with
  reading paused, until the queue drains (a hard bound: one read of pipelined
  requests cannot queue thousands);
* at most ``max_body_buffer`` bytes of a body are buffered, and reading stops
  while the connection's write buffer is above its high-water mark (a client
  that pipelines and never reads cannot grow our memory); answers held back
  for the end of the loop iteration count too: past ``write_high`` of them the
  batch goes to the transport at once, so its mark stops reading within the
  read being parsed, on every door;
* at the connection cap the oldest idle connection, else the slowest head in
  progress, is shed for a new one;
* requests are answered one after the other by a loop, never by recursion.

The connection hands each complete request head to a handler (the decision
endpoints, the proxy, the admin endpoints: see :class:`Handler`), which answers
at once with bytes, or with a coroutine for what must wait (a Redis store, an
upstream).  Bad requests are counted and logged at most once per interval,

The package, along its seams (each imports only those above it):

* :mod:`.limits` -- what a connection may cost (:class:`~.limits.Limits`) and
  the refusal of a request (:class:`~.limits.ClientError`);
* :mod:`.body` -- a request body as it arrives, bounded (:class:`~.body.Body`);
* :mod:`.head` -- the request head: :class:`~.head.Request`, the field tables and
  the grammar checks llhttp leaves to us (Host, targets, paths);
* :mod:`.state` -- a listener's :class:`~.state.ServerState`: its connections
  (the cap, the sweep of timeouts), the answers batched per loop iteration;
* :mod:`.connection` -- :class:`~.connection.HttpConnection`, the asyncio
  protocol (llhttp's callbacks, the pipeline queue, answering in order), and
  the :class:`~.connection.Handler` it hands each request to.
"""
