package tide

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// runUntilSignal starts something (a Server, a Scheduler), waits for SIGINT
// or SIGTERM, then stops it. It listens before starting: a signal that
// arrives as soon as start returns must still stop it gracefully. It returns
// start's error, or nil after a signal.
func runUntilSignal(log *slog.Logger, start func() error, stop func()) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	if err := start(); err != nil {
		return err
	}
	got := <-sig
	log.Info("tide: signal received; shutting down", "signal", got.String())
	stop()
	return nil
}

// safely calls a user callback, logging (not propagating) a panic.
func safely(log *slog.Logger, what string, f func()) {
	defer func() {
		if r := recover(); r != nil {
			log.Error("tide: "+what+" panicked", "panic", fmt.Sprint(r))
		}
	}()
	f()
}
