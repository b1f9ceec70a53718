package encrypt_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/membroker"
	"github.com/tidequeue/tide/encrypt"
)

func Example() {
	// In production the keys come from the environment or a secret store,
	// e.g. TIDE_ENCRYPTION_KEYS="1:$(openssl rand -base64 32)".
	secret := make([]byte, encrypt.SecretSize)
	_, _ = rand.Read(secret)
	keys, err := encrypt.ParseKeys("1:" + base64.StdEncoding.EncodeToString(secret))
	if err != nil {
		fmt.Println(err)
		return
	}

	store := membroker.New() // redisbroker.New(rdb) in production
	b, err := encrypt.Wrap(store, keys...)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()

	// Client, Server and Inspector take the wrapped broker, unchanged.
	info, err := tide.NewClient(b).Enqueue(ctx, tide.NewTask("email:send", []byte(`{"to":"alice@example.com"}`)))
	if err != nil {
		fmt.Println(err)
		return
	}

	// What the store holds is sealed.
	raw, _ := store.GetTask(ctx, "default", info.ID)
	fmt.Println("store holds the address:", bytes.Contains(raw.Payload, []byte("alice")))

	// The Inspector (and the dashboard and CLI on it) reads plaintext.
	got, _ := tide.NewInspector(b).GetTaskInfo(ctx, "default", info.ID)
	fmt.Println("inspector reads:", string(got.Payload))

	// Handlers get plaintext.
	seen := make(chan string, 1)
	mux := tide.NewServeMux()
	mux.HandleFunc("email:send", func(ctx context.Context, t *tide.Task) error {
		seen <- string(t.Payload())
		return nil
	})
	srv := tide.NewServer(b, tide.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := srv.Start(mux); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("handler gets:", <-seen)
	srv.Shutdown()
	// Output:
	// store holds the address: false
	// inspector reads: {"to":"alice@example.com"}
	// handler gets: {"to":"alice@example.com"}
}

func ExampleParseKeys() {
	// Errors name the entry and key, never the secret.
	_, err := encrypt.ParseKeys("2:c2hvcnQ=,1:" + base64.StdEncoding.EncodeToString(make([]byte, 32)))
	fmt.Println(err)
	// Output:
	// encrypt: key list: entry 1 of 2 (key 2): the secret is 5 bytes, want 32
}
