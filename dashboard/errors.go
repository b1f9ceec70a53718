package dashboard

import (
	"errors"
	"io"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
)

// isRedisUnavailable reports the errors go-redis and the brokers return when
// the connection, not the command, failed.
func isRedisUnavailable(err error) bool {
	return errors.Is(err, redis.ErrClosed) || errors.Is(err, redis.ErrPoolTimeout) ||
		errors.Is(err, broker.ErrClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
