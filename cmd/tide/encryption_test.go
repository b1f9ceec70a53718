package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/encrypt"
)

// testKey returns an encryption key whose secret is 32 bytes of b, and its
// TIDE_ENCRYPTION_KEYS form.
func testKey(id, b byte) (encrypt.Key, string) {
	secret := bytes.Repeat([]byte{b}, encrypt.SecretSize)
	return encrypt.Key{ID: id, Secret: secret}, fmt.Sprintf("%d:%s", id, base64.StdEncoding.EncodeToString(secret))
}

// sealedClient is a client whose payloads are encrypted with key.
func (e *env) sealedClient(key encrypt.Key) *tide.Client {
	e.t.Helper()
	wb, err := encrypt.Wrap(e.b, key)
	if err != nil {
		e.t.Fatal(err)
	}
	return tide.NewClient(wb)
}

func TestEncryptionKeys(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	key, keys := testKey(1, 7)
	_, otherKeys := testKey(1, 9) // same ID, another secret
	const payload = `{"card":"4111-1111-secret"}`
	c := e.sealedClient(key)
	if _, err := c.Enqueue(ctx, tide.NewTask("card:charge", []byte(payload)), tide.Queue("pay"), tide.TaskID("c1"), tide.ProcessIn(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// A task enqueued before encryption was turned on reads as it is.
	e.enqueue("card:charge", `{"card":"plain"}`, tide.Queue("pay"), tide.TaskID("p1"), tide.ProcessIn(time.Hour))
	sealedLen := len(payload) + encrypt.Overhead

	// Without the keys: said to be encrypted, not shown as base64 garbage.
	r := e.tide("tasks", "show", "pay", "c1")
	r.want(t, exitOK, fmt.Sprintf("Payload:          (encrypted: %d bytes; pass --encryption-keys or set TIDE_ENCRYPTION_KEYS to see it)", sealedLen))
	if strings.Contains(r.stdout, "secret") || strings.Contains(r.stdout, "base64") {
		t.Errorf("without keys:\n%s", r.stdout)
	}
	r = e.tide("tasks", "show", "pay", "c1", "--json")
	var tj taskJSON
	if err := json.Unmarshal([]byte(r.stdout), &tj); err != nil || !tj.PayloadEncrypted || tj.Task == nil || tj.Payload != nil {
		t.Errorf("--json without keys: %v\n%s", err, r.stdout)
	}

	// With the keys, by flag or environment: the plaintext.
	e.tide("tasks", "show", "pay", "c1", "--encryption-keys", keys).want(t, exitOK,
		fmt.Sprintf("%s  (JSON, %d bytes)", payload, len(payload)))
	e.tide("tasks", "show", "pay", "p1", "--encryption-keys", keys).want(t, exitOK, `{"card":"plain"}  (JSON, 16 bytes)`)
	e.vars["TIDE_ENCRYPTION_KEYS"] = keys
	r = e.tide("tasks", "ls", "pay", "--state", "scheduled", "--json")
	var ts []taskJSON
	var got bytes.Buffer
	if err := json.Unmarshal([]byte(r.stdout), &ts); err == nil && len(ts) == 2 {
		_ = json.Compact(&got, ts[0].Payload)
	}
	if len(ts) != 2 || got.String() != payload || ts[0].PayloadEncrypted {
		t.Errorf("ls --json with keys:\n%s", r.stdout)
	}

	// Keys that do not open it: said so, with the reason; never garbage.
	e.vars["TIDE_ENCRYPTION_KEYS"] = otherKeys
	r = e.tide("tasks", "show", "pay", "c1")
	r.want(t, exitOK, "(not decrypted with the keys given: see the last error)", "encrypt: cannot decrypt payload: authentication failed with key 1")
	delete(e.vars, "TIDE_ENCRYPTION_KEYS")

	// A bad key list is a usage error that names the problem and never
	// repeats the list.
	_, good := testKey(2, 5)
	goodSecret := strings.TrimPrefix(good, "2:")
	for _, c := range []struct{ keys, want string }{
		{"1:c2hvcnRTRUNSRVRzaG9ydA", "entry 1 of 1 (key 1): the secret is 16 bytes, want 32"},
		{"SECRETWITHOUTCOLON", "entry 1 of 1 has no ':'"},
		{"0:" + goodSecret, "entry 1 of 1: the key ID is not a number from 1 to 255"},
		{good + ",2:" + goodSecret, "entry 2 of 2 (key 2): key ID 2 is already used by entry 1"},
		{"3:SECRET*not*base64*SECRET", "entry 1 of 1 (key 3): the secret is not valid base64"},
		{good + ",", "entry 2 of 2 is empty"},
	} {
		secret := strings.TrimPrefix(strings.TrimPrefix(c.keys, "1:"), "3:")
		r := e.tide("tasks", "show", "pay", "c1", "--encryption-keys", c.keys)
		if r.code != exitUsage || !strings.Contains(r.stderr, "--encryption-keys: key list: "+c.want) {
			t.Errorf("--encryption-keys %q: exit %d\n%s", c.keys, r.code, r.stderr)
		}
		e.vars["TIDE_ENCRYPTION_KEYS"] = c.keys
		r2 := e.tide("tasks", "ls", "pay", "--json")
		delete(e.vars, "TIDE_ENCRYPTION_KEYS")
		if msg, code := jsonError(t, r2); code != exitUsage || !strings.HasPrefix(msg, "TIDE_ENCRYPTION_KEYS: key list: "+c.want) {
			t.Errorf("TIDE_ENCRYPTION_KEYS %q: %d %s", c.keys, code, msg)
		}
		for _, out := range []string{r.stdout, r.stderr, r2.stdout, r2.stderr} {
			if strings.Contains(out, secret) || strings.Contains(out, goodSecret) {
				t.Errorf("the key list is echoed: %s", out)
			}
		}
	}
	// Commands without task data do not take the flag.
	if r := e.tide("queues", "--encryption-keys", keys); r.code != exitUsage || !strings.Contains(r.stderr, "unknown flag --encryption-keys") {
		t.Errorf("queues --encryption-keys: %d %s", r.code, r.stderr)
	}
}

func TestEncryptionKeysServeAndDash(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	key, keys := testKey(4, 3)
	const token = "gateway-token-0123456789"
	c := e.sealedClient(key)
	if _, err := c.Enqueue(ctx, tide.NewTask("card:charge", []byte(`{"card":"4111-secret"}`)), tide.Queue("pay"), tide.TaskID("c1"), tide.ProcessIn(time.Hour)); err != nil {
		t.Fatal(err)
	}
	e.vars["TIDE_GATEWAY_TOKENS"] = token
	e.vars["TIDE_ENCRYPTION_KEYS"] = keys

	// serve encrypts what it enqueues, and shows it in plaintext.
	base, _ := e.start("serve", "--addr", "127.0.0.1:0")
	code, body := post(t, base+"/v1/tasks", token, `{"type":"card:charge","queue":"pay","payload":{"card":"5500-secret"},"task_id":"g1","delay":"1h"}`)
	if code != http.StatusCreated {
		t.Fatalf("POST: %d %s", code, body)
	}
	if ti, err := e.in.GetTaskInfo(ctx, "pay", "g1"); err != nil || !encrypt.IsSealed(ti.Payload) || bytes.Contains(ti.Payload, []byte("5500")) {
		t.Fatalf("the stored payload is not encrypted: %+v %v", ti, err)
	}
	req, _ := http.NewRequest("GET", base+"/v1/queues/pay/tasks/c1", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	resp.Body.Close()
	if !strings.Contains(buf.String(), "4111-secret") {
		t.Errorf("GET a sealed task through serve: %d %s", resp.StatusCode, buf.String())
	}

	// dash shows the plaintext with the keys, and not without.
	base, _ = e.start("dash", "--addr", "127.0.0.1:0")
	if code, body := get(t, base+"/task?q=pay&id=c1"); code != http.StatusOK || !strings.Contains(body, "4111-secret") {
		t.Errorf("dash with keys: %d\n%.3000s", code, body)
	}
	delete(e.vars, "TIDE_ENCRYPTION_KEYS")
	base, _ = e.start("dash", "--addr", "127.0.0.1:0")
	if code, body := get(t, base+"/task?q=pay&id=c1"); code != http.StatusOK || strings.Contains(body, "4111-secret") {
		t.Errorf("dash without keys: %d\n%.3000s", code, body)
	}
}
