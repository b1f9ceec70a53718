package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/dashboard"
	"github.com/tidequeue/tide/gateway"
	"github.com/tidequeue/tide/webhook"
)

var cmdServe = &command{
	name: "serve", args: "[--addr 127.0.0.1:8080] [--token T]... [--webhook-secret S --webhook-allow HOSTS] [--encryption-keys K]", maxArgs: 0, redis: true, taskData: true,
	summary: "run the HTTP gateway (and the webhook sender) with /metrics",
	flags: func(fs *flag.FlagSet, o *cmdOpts) {
		fs.StringVar(&o.addr, "addr", defaultAddr, "`address` to listen on; :8080 or 0.0.0.0:8080 for every network interface")
		fs.Var(&o.tokens, "token", "bearer `token` clients must send; repeat for several (default $TIDE_GATEWAY_TOKENS, comma-separated)")
		fs.Int64Var(&o.maxBody, "max-body", gateway.DefaultMaxBodyBytes, "largest request body, in `bytes`")
		fs.Var(&o.allowQueues, "allow-queue", "only allow these `queues` (repeat, or comma-separate); default all")
		fs.Var(&o.allowHosts, "allow-host", "host `names` /metrics answers to besides localhost and IP addresses: name or name:port (repeat, or comma-separate; default $TIDE_SERVE_ALLOW_HOSTS)")
		fs.StringVar(&o.whSecret, "webhook-secret", "", "send tide:webhook tasks, signed with this `secret` (default $TIDE_WEBHOOK_SECRET)")
		fs.Var(&o.whAllow, "webhook-allow", "`hosts` webhooks may call: host, host:port or *.domain (repeat, or comma-separate; default $TIDE_WEBHOOK_ALLOW)")
		fs.StringVar(&o.whQueue, "webhook-queue", webhook.DefaultQueue, "`queue` of the webhook tasks")
		fs.IntVar(&o.whConc, "webhook-concurrency", 10, "webhooks sent at once")
		o.whTimeout = durationFlag(webhook.DefaultTimeout)
		fs.Var(&o.whTimeout, "webhook-timeout", "time a receiver has to answer, e.g. `10s`")
		fs.BoolVar(&o.whPrivate, "webhook-allow-private", false, "let webhooks and their notifications reach loopback and private addresses")
	},
	help: `
Run the HTTP gateway, through which applications in any language enqueue,
inspect and delete tasks with JSON over HTTP:

  POST   /v1/tasks                               enqueue a task
  GET    /v1/queues/{queue}/tasks/{id}           read a task
  DELETE /v1/queues/{queue}/tasks/{id}           delete a task that is not running
  POST   /v1/queues/{queue}/tasks/{id}/cancel    cancel a running task
  GET    /healthz                                liveness, no token needed
  GET    /metrics                                Prometheus metrics, no token needed

Every /v1 request needs "Authorization: Bearer <token>" with one of the
tokens (each at least 16 characters). Put TLS in front of it (a proxy or
load balancer): tokens are passwords. Prefer the environment variables for
secrets: flags show in 'ps'.

It listens on 127.0.0.1:8080, this machine only, unless --addr says
otherwise: --addr :8080 (or 0.0.0.0:8080) for every network interface, so
that other machines can reach it.

With a webhook secret and allowed hosts, serve also runs a tide server that
sends the tide:webhook tasks of --webhook-queue: each is POSTed (or its
method) to its URL, signed with "Tide-Signature: t=<unix>,v1=<hex
HMAC-SHA256 of t.body>", and retried on 5xx, 408, 429 and timeouts (15s, 3m,
10m, 30m, 1h, 2h, 6h, then every 15h). Only the allowed hosts are called,
and never private or loopback addresses unless --webhook-allow-private.
The NotifyURL notifications of the tasks in that queue obey the same rules
and are signed the same way: one to another host is archived.

` + fmt.Sprintf(metricsHelp, "tide-serve") + `
With webhooks, it also has the attempts this process made
(tide_tasks_processed_total{type,queue} and the like).

` + encryptionHelp + `
With the keys, the gateway encrypts the payloads it enqueues and returns
tasks in plaintext, and the webhook sender reads its tasks.

` + logLevelHelp + `

Stops on SIGINT or SIGTERM, letting requests and webhooks in flight finish.

Examples:
  export TIDE_GATEWAY_TOKENS=$(openssl rand -hex 32)
  tide serve --addr :8080          # every interface; the default is 127.0.0.1:8080

  TIDE_WEBHOOK_SECRET=$(cat /run/secrets/webhook) \
    tide serve --webhook-allow hooks.example.com,*.partner.example

  curl -X POST localhost:8080/v1/tasks -H "Authorization: Bearer $TIDE_GATEWAY_TOKENS" \
    -H 'Content-Type: application/json' \
    -d '{"type":"order:cancel","payload":{"order_id":42},"task_id":"order-cancel:42","delay":"15m"}'`,
	check: checkServe,
	run:   runServe,
}

// checkServe resolves the tokens and webhook settings from flags and the
// environment into o, and checks them before connecting.
func checkServe(a *app, o *cmdOpts, _ []string) error {
	if len(o.tokens) == 0 {
		_ = o.tokens.Set(a.env("TIDE_GATEWAY_TOKENS"))
	}
	if len(o.tokens) == 0 {
		return usagef(o.cmd, "serve needs a token: pass --token or set TIDE_GATEWAY_TOKENS (generate one with: openssl rand -hex 32)")
	}
	for i, t := range o.tokens {
		if err := checkToken(o.cmd, fmt.Sprintf("token %d", i+1), t); err != nil {
			return err
		}
	}
	if o.whSecret == "" {
		o.whSecret = a.env("TIDE_WEBHOOK_SECRET")
	}
	if len(o.whAllow) == 0 {
		_ = o.whAllow.Set(a.env("TIDE_WEBHOOK_ALLOW"))
	}
	switch {
	case o.whSecret != "" && len(o.whAllow) == 0:
		return usagef(o.cmd, "a webhook secret needs --webhook-allow (or TIDE_WEBHOOK_ALLOW): the hosts webhooks may call")
	case o.whSecret == "" && len(o.whAllow) > 0:
		return usagef(o.cmd, "--webhook-allow needs a webhook secret: --webhook-secret or TIDE_WEBHOOK_SECRET")
	case o.whSecret == "":
		return nil
	}
	if o.whConc < 1 {
		return usagef(o.cmd, "--webhook-concurrency %d must be at least 1", o.whConc)
	}
	if err := tide.ValidateQueueName(o.whQueue); err != nil {
		return usagef(o.cmd, "--webhook-queue: %s", strings.TrimPrefix(err.Error(), tide.ErrInvalidTask.Error()+": "))
	}
	if _, err := webhook.Handler(o.webhookConfig()); err != nil {
		return usagef(o.cmd, "%s", strings.TrimPrefix(err.Error(), "tide: "))
	}
	return nil
}

func (o *cmdOpts) webhookConfig() webhook.Config {
	return webhook.Config{
		Secret: []byte(o.whSecret), AllowedHosts: o.whAllow, AllowPrivateNetworks: o.whPrivate, Timeout: time.Duration(o.whTimeout),
	}
}

func runServe(ctx context.Context, a *app, o *cmdOpts, _ []string) error {
	log := a.logger()

	gw, err := gateway.New(a.c, a.in, gateway.Config{Tokens: o.tokens, MaxBodyBytes: o.maxBody, AllowedQueues: o.allowQueues, Logger: log})
	if err != nil {
		return usagef(o.cmd, "%s", strings.TrimPrefix(err.Error(), "tide: "))
	}
	m, err := newMetrics(a.in, a.serviceName("tide-serve"), log)
	if err != nil {
		return err
	}
	defer m.shutdown()

	if o.whSecret != "" {
		h, err := webhook.Handler(o.webhookConfig())
		if err != nil {
			return usagef(o.cmd, "%s", strings.TrimPrefix(err.Error(), "tide: "))
		}
		mux := tide.NewServeMux()
		mux.Use(m.mw)
		mux.Handle(webhook.TaskType, h)
		srv := tide.NewServer(a.tb, tide.Config{
			Concurrency:    o.whConc,
			Queues:         map[string]int{o.whQueue: 1},
			RetryDelayFunc: webhook.RetryDelayFunc(nil),
			Logger:         log,
			// The notifications (NotifyURL) of the tasks it runs come from
			// the same gateway clients as the webhooks: the same hosts,
			// the same private-network rule, the same signature.
			NotifySecret:       o.whSecret,
			NotifyAllowPrivate: o.whPrivate,
			NotifyAllowedHosts: o.whAllow,
		})
		if err := srv.Start(mux); err != nil {
			return fmt.Errorf("tide: start the webhook server: %w", err)
		}
		defer srv.Shutdown()
		a.status(nil, "sending webhooks from queue %q to %s", o.whQueue, strings.Join(o.whAllow, ", "))
	}

	mh, err := a.metricsHandler(o, m, "TIDE_SERVE_ALLOW_HOSTS")
	if err != nil {
		return err
	}
	h := http.NewServeMux()
	h.Handle("/metrics", mh)
	h.Handle("/", gw)
	return a.serveHTTP(ctx, o.addr, h, "gateway", "", log)
}

var cmdDash = &command{
	name: "dash", args: "[--addr 127.0.0.1:8080] [--token T] [--read-token T] [--allow-host HOST]... [--title T] [--encryption-keys K] [--history-dsn DSN]", maxArgs: 0, redis: true, taskData: true,
	summary: "serve the web dashboard, with /metrics",
	flags: func(fs *flag.FlagSet, o *cmdOpts) {
		fs.StringVar(&o.addr, "addr", defaultAddr, "`address` to listen on; :8080 or 0.0.0.0:8080 for every network interface")
		fs.StringVar(&o.token, "token", "", "`token` operators log in with to change things, at least 16 characters (default $TIDE_DASH_TOKEN); without one the dashboard is read-only")
		fs.StringVar(&o.readToken, "read-token", "", "`token` needed to see anything, at least 16 characters and not --token (default $TIDE_DASH_READ_TOKEN); without one reading needs no login")
		fs.Var(&o.allowHosts, "allow-host", "host `names` the dashboard and /metrics answer to besides localhost and IP addresses: name or name:port (repeat, or comma-separate; default $TIDE_DASH_ALLOW_HOSTS)")
		fs.StringVar(&o.title, "title", "", "`title` shown in the dashboard (e.g. the environment)")
		historyFlags(fs, o)
	},
	help: `
Serve the web dashboard: queues, tasks, servers and periodic tasks, with
buttons to run, archive, delete and cancel tasks and to pause queues. Those
changes need the token (log in with it); without a token the dashboard is
read-only. Prefer the environment variables for tokens: flags show in 'ps'.

Reading needs no token unless --read-token (TIDE_DASH_READ_TOKEN) is set:
then every page needs a login with the read token (which only shows) or the
token, or either as "Authorization: Bearer <token>". The pages show
payloads and errors: so the dashboard listens on 127.0.0.1:8080, this
machine only, unless --addr says otherwise (reach it with an SSH tunnel, or
put it behind your SSO proxy). --addr :8080 (or 0.0.0.0:8080) listens on
every network interface; tide then warns when reading needs no login.

The dashboard answers only to requests for localhost, an IP address or a
host name given with --allow-host (TIDE_DASH_ALLOW_HOSTS): a request for
another host gets "421 misdirected request", which protects it from DNS
rebinding. Reached by name (tide.example.com, through a proxy or DNS), add
that name: --allow-host tide.example.com (any port) or
tide.example.com:8443 (that port only); no wildcards.

` + historyHelp + `

The task page then shows that history, and a task Redis no longer holds
gets a page with its history instead of "not found". An error reading it
is shown on the page.

` + encryptionHelp + `

` + fmt.Sprintf(metricsHelp, "tide-dash") + `

` + logLevelHelp + `

Stops on SIGINT or SIGTERM.

Examples:
  tide dash                           # read-only, this machine only: http://127.0.0.1:8080
  ssh -L 8080:127.0.0.1:8080 queue-host   # then open http://127.0.0.1:8080 on your laptop
  TIDE_DASH_TOKEN=$(openssl rand -hex 32) tide dash --addr :8080 --title production
  TIDE_DASH_READ_TOKEN=$(openssl rand -hex 32) TIDE_DASH_TOKEN=$(openssl rand -hex 32) \
    tide dash --addr :8080 --allow-host tide.example.com`,
	check: checkDash,
	run:   runDash,
}

// checkDash resolves the tokens and host names from flags and the
// environment into o, and checks them before connecting.
func checkDash(a *app, o *cmdOpts, _ []string) error {
	if o.token == "" {
		o.token = a.env("TIDE_DASH_TOKEN")
	}
	if o.readToken == "" {
		o.readToken = a.env("TIDE_DASH_READ_TOKEN")
	}
	if len(o.allowHosts) == 0 {
		_ = o.allowHosts.Set(a.env("TIDE_DASH_ALLOW_HOSTS"))
	}
	if o.token != "" {
		if err := checkToken(o.cmd, "the token", o.token); err != nil {
			return err
		}
	}
	if o.readToken != "" {
		if err := checkToken(o.cmd, "the read token", o.readToken); err != nil {
			return err
		}
		if o.readToken == o.token {
			return usagef(o.cmd, "the read token is the same as the token: use a different read token, or none")
		}
	}
	if err := a.openHistory(o); err != nil {
		return err
	}
	// The dashboard checks its options when it is built; build one now, on
	// a broker it does not call, so that a mistake is a usage error found
	// before connecting.
	if _, err := dashboard.New(tide.NewInspector(noBroker{}), o.dashOptions(slog.New(slog.DiscardHandler))); err != nil {
		msg := strings.TrimPrefix(err.Error(), "tide/dashboard: ")
		if m, ok := strings.CutPrefix(msg, "AllowedHosts: "); ok {
			msg = "--allow-host " + m
		}
		return usagef(o.cmd, "%s", msg)
	}
	return nil
}

func (o *cmdOpts) dashOptions(log *slog.Logger) dashboard.Options {
	return dashboard.Options{Token: o.token, ReadToken: o.readToken, AllowedHosts: o.allowHosts, Title: o.title, Logger: log}
}

// noBroker is a broker that is never called: checkDash builds a dashboard
// on it to check the options.
type noBroker struct{ broker.Broker }

// defaultAddr is where dash and serve listen without --addr: this machine
// only, since the dashboard's pages and both /metrics need no login.
const defaultAddr = "127.0.0.1:8080"

// checkToken refuses a token shorter than gateway.MinTokenLength; what
// names it ("token 2", "the token").
func checkToken(cmd *command, what, token string) error {
	if len(token) < gateway.MinTokenLength {
		return usagef(cmd, "%s is %s; use at least %d (generate one with: openssl rand -hex 32)",
			what, plural(len(token), "character", "characters"), gateway.MinTokenLength)
	}
	return nil
}

// serviceName is the service.name of /metrics: $OTEL_SERVICE_NAME, else def.
func (a *app) serviceName(def string) string {
	if s := a.env("OTEL_SERVICE_NAME"); s != "" {
		return s
	}
	return def
}

func runDash(ctx context.Context, a *app, o *cmdOpts, _ []string) error {
	log := a.logger()
	opts := o.dashOptions(log)
	if a.hist != nil {
		opts.History = a.dashHistory
	}
	opts.Client = a.c // cancels workflows and batches
	dash, err := dashboard.New(a.in, opts)
	if err != nil {
		return fmt.Errorf("tide: dashboard: %w", err)
	}
	open := ""
	switch {
	case o.readToken != "":
		// Reading needs a login too: nothing to warn about.
	case o.token == "":
		open = "it has no token: anyone who reaches it can read every queue and task, payloads and errors included, and no login is asked; listen on 127.0.0.1 (the default) and use an SSH tunnel, or put it behind a proxy that logs people in, or set --read-token"
	default:
		open = "reading needs no login (only changes need the token): set --read-token (TIDE_DASH_READ_TOKEN), put it behind a proxy that logs people in, or listen on 127.0.0.1 (the default)"
	}
	if o.token == "" {
		a.note("no --token or TIDE_DASH_TOKEN: the dashboard is read-only")
	}
	m, err := newMetrics(a.in, a.serviceName("tide-dash"), log)
	if err != nil {
		return err
	}
	defer m.shutdown()
	mh, err := a.metricsHandler(o, m, "TIDE_DASH_ALLOW_HOSTS")
	if err != nil {
		return err
	}
	h := http.NewServeMux()
	h.Handle("/metrics", mh)
	h.Handle("/", dash)
	return a.serveHTTP(ctx, o.addr, h, "dashboard", open, log)
}

// serveHTTP serves h on addr until ctx ends, then shuts down gracefully.
// It reports the address it listens on (useful with port 0) on stderr, and
// whether other machines can reach it; then, if exposed is set, it warns
// with it.
func (a *app) serveHTTP(ctx context.Context, addr string, h http.Handler, what, exposed string, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("tide: %s: cannot listen on %s: %v (is another program using the port? choose another with --addr)", what, addr, err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		WriteTimeout:      time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	scope := "this machine only"
	loopback := false
	if ta, ok := ln.Addr().(*net.TCPAddr); ok {
		switch {
		case ta.IP.IsLoopback():
			loopback = true
		case ta.IP.IsUnspecified():
			scope = "every network interface: other machines can reach it"
		default:
			scope = "other machines can reach it"
		}
	}
	if loopback {
		scope += "; --addr :8080 for every network interface"
	}
	url := "http://" + ln.Addr().String()
	a.status(map[string]string{"url": url}, "%s listening on %s (%s)", what, url, scope)
	if !loopback && exposed != "" {
		a.warn("the %s listens on %s and %s", what, ln.Addr(), exposed)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("tide: %s: %w", what, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("tide: %s: %w", what, err)
	}
	a.status(nil, "%s stopped", what)
	return nil
}
