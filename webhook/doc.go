// Package webhook is tide's built-in webhook task type: a task that carries an
// HTTP request (URL, method, headers, body) and a handler that sends it,
// signed, to an allowed host, retrying failures on a schedule.
//
// # Sending
//
// The producer builds the task with NewTask and enqueues it like any other;
// it goes to the queue DefaultQueue ("webhooks") unless a tide.Queue option
// says otherwise:
//
//	t, err := webhook.NewTask(webhook.Payload{
//		URL:  "https://hooks.example.com/orders",
//		Body: []byte(`{"order":42,"status":"paid"}`),
//	}, tide.MaxRetry(8))
//	info, err := client.Enqueue(ctx, t)
//
// A server registers the handler for TaskType and serves the queue. The
// handler is given the signing secret and the hosts it may call:
//
//	h, err := webhook.Handler(webhook.Config{
//		Secret:       []byte(os.Getenv("TIDE_WEBHOOK_SECRET")),
//		AllowedHosts: []string{"hooks.example.com", "*.partner.example"},
//	})
//	mux.Handle(webhook.TaskType, h)
//	srv := tide.NewServer(b, tide.Config{
//		Queues:         map[string]int{webhook.DefaultQueue: 1},
//		RetryDelayFunc: webhook.RetryDelayFunc(nil),
//	})
//
// Apps in other languages enqueue the same task through the HTTP gateway
// (package gateway) with "type": "tide:webhook" and the payload described at
// Payload.
//
// # What the receiver gets
//
// Every attempt is one request with the task's method (default POST), its
// headers and body, and these headers set by tide:
//
//	Tide-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">
//	Tide-Delivery:  <task ID>          (the same on every retry: deduplicate on it)
//	Tide-Attempt:   <1 for the first attempt, 2 for the first retry, ...>
//	Content-Type:   unless the task sets one, application/json for a JSON body,
//	                else application/octet-stream
//	User-Agent:     tide-webhook/1 unless the task sets one
//
// Delivery is at least once: a receiver may see the same Tide-Delivery
// twice (a timeout after the receiver had already acted, a worker crash) and
// should act on it once.
//
// # Verifying a request
//
// The receiver recomputes the HMAC over the timestamp, a dot and the raw
// request body (before any JSON parsing) with the shared secret, compares it
// in constant time with each v1 value, and rejects timestamps too far from
// its clock (which bounds replays). In Go that is Verify:
//
//	body, _ := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
//	if err := webhook.Verify(secret, r.Header.Get("Tide-Signature"), body, 5*time.Minute); err != nil {
//		http.Error(w, "bad signature", http.StatusUnauthorized)
//		return
//	}
//
// In PHP:
//
//	$body = file_get_contents('php://input');
//	parse_str(str_replace(',', '&', $_SERVER['HTTP_TIDE_SIGNATURE'] ?? ''), $sig);
//	$ok = isset($sig['t'], $sig['v1'])
//	    && abs(time() - (int)$sig['t']) <= 300
//	    && hash_equals(hash_hmac('sha256', $sig['t'] . '.' . $body, $secret), $sig['v1']);
//
// The signature covers the timestamp and the body only: not the URL, the
// method or the other headers. A header may carry several v1 values (kept
// for secret rotation); a request is genuine when any of them matches.
//
// The notifications of tide.NotifyURL carry the same header, signed with
// tide.Config.NotifySecret, and are checked with Verify the same way.
//
// # Failures and retries
//
// A 2xx response is success. Anything else fails the attempt, and the error
// (a *StatusError for an HTTP status) names the method, the URL without its
// query and credentials, the status and the start of the response body:
//
//   - 5xx, 408, 425 and 429 responses, timeouts (Config.Timeout, default
//     10s) and network errors are retried with the server's RetryDelayFunc.
//     RetryDelayFunc(nil) gives webhook tasks tide.NotificationRetryDelay
//     (15s, 3m, 10m, 30m, 1h, 2h, 6h, then every 15h) and honours a
//     Retry-After header of 429 and 503 responses (up to 24h).
//   - A 3xx response that is not followed (see Redirects below) is retried
//     the same way, and its error also shows the redirect's target (the
//     Location header, resolved, without query or credentials, control
//     characters replaced, bounded in length) and why it was not followed.
//     A 3xx never counts as delivered.
//   - Other 4xx responses are archived at once (the error wraps
//     tide.SkipRetry): the receiver refused this request and would refuse it
//     again. Set Config.RetryClientErrors to retry them too. An archived task
//     can be sent again with `tide tasks run <queue> <id>`.
//   - A task that cannot be sent at all is archived at once: an undecodable or
//     invalid payload, a URL whose host is not allowed, a scheme other than
//     http and https, a redirect to a host or scheme that is not allowed, or
//     an address in a private network, also one reached by a redirect (see
//     below).
//
// # Redirects
//
// Only 307 and 308 redirects are followed: they keep the method and the
// body, so the receiver at the new location gets the same request. They are
// followed at most 5 times per attempt, within the attempt's Config.Timeout,
// and only to an allowed host with an http or https URL; the new address is
// checked against private networks like the first (below). Each followed
// request is signed again, over the same body, with the time it is sent as
// its t=: every request a receiver gets verifies with the usual tolerance,
// however long the earlier hops took. Tide-Delivery and Tide-Attempt stay
// the same. A Referer header is only sent if the task set one (net/http
// would send the previous URL, query included). As net/http does, the
// task's Authorization and Cookie headers are dropped when a redirect goes
// to a host that is neither the task's host nor a subdomain of it.
//
// 301, 302 and 303 are never followed, because an HTTP client follows them
// with a GET without the body (which would still carry the Tide-* headers
// and count as delivered): the attempt fails and is retried, and the error
// names the status and the Location, so that the producer can switch to the
// new URL or the receiver answer with a 307 or 308. A 307 or 308 without a
// Location, or one more than 5 redirects deep (a loop), fails and is
// retried the same way. A 307 or 308 to a host or scheme that is not
// allowed, or whose host resolves to a non-public address, is refused and
// the task archived.
//
// # Where requests may go
//
// The handler only calls hosts named in Config.AllowedHosts, so a task,
// which may come from another system through the gateway, cannot make the
// server call arbitrary addresses (SSRF). Redirects are followed only as
// described above. Unless Config.AllowPrivateNetworks is set, the handler
// also refuses to connect to loopback, private, link-local and other
// non-public addresses, checked on the address actually dialled, after DNS
// resolution, for the first request and every redirect, so an allowed name
// that resolves (or is rebound) to 127.0.0.1 or 169.254.169.254 is refused.
// Proxies from the environment are not used.
//
// A tide.Server sends tide.NotifyURL notifications with the same guarded
// sender: the same redirect rules and private-network refusal, with
// tide.Config.NotifyAllowPrivate and tide.Config.NotifyAllowedHosts in
// the place of AllowPrivateNetworks and AllowedHosts (where an empty list
// allows any public host).
package webhook
