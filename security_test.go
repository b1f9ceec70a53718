package tide_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testlog"
)

// certs writes a CA and a server and client certificate signed by it.
type certs struct {
	dir                      string
	caPool                   *x509.CertPool
	clientCert               tls.Certificate
	caFile, crtFile, keyFile string
}

func makeCerts(t *testing.T) *certs {
	t.Helper()
	dir := t.TempDir()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := newKey()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tide test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(cn string, usage x509.ExtKeyUsage, serial int64) ([]byte, *ecdsa.PrivateKey) {
		k := newKey()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature,
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		b, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	c := &certs{dir: dir, caPool: x509.NewCertPool()}
	c.caPool.AddCert(ca)
	c.caFile = write("ca.crt", "CERTIFICATE", caDER)
	srvDER, srvKey := issue("127.0.0.1", x509.ExtKeyUsageServerAuth, 2)
	c.crtFile = write("server.crt", "CERTIFICATE", srvDER)
	c.keyFile = write("server.key", "EC PRIVATE KEY", keyDER(srvKey))
	cliDER, cliKey := issue("tide client", x509.ExtKeyUsageClientAuth, 3)
	cert, err := tls.X509KeyPair(
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cliDER}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER(cliKey)}))
	if err != nil {
		t.Fatal(err)
	}
	c.clientCert = cert
	return c
}

// TestTLSAndACL runs a client and a server over TLS (with client
// certificates) as an ACL user that may only touch tide's key prefix.
func TestTLSAndACL(t *testing.T) {
	t.Parallel()
	c := makeCerts(t)
	tlsPort := redistest.FreePort(t)
	srv := redistest.Start(t, "--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", c.crtFile, "--tls-key-file", c.keyFile, "--tls-ca-cert-file", c.caFile,
		"--tls-auth-clients", "yes")
	ctx := context.Background()
	const prefix = "tide-acl"
	const password = "s3cret-Pa55word"
	admin := redistest.Client(t, srv.Addr)
	if err := admin.Do(ctx, "ACL", "SETUSER", "tideapp", "on", ">"+password,
		"resetkeys", "~"+prefix+":*", "resetchannels", "&"+prefix+":*",
		"-@all", "+@read", "+@write", "+@scripting", "+@pubsub", "+@connection", "+@transaction", "+time", "-@dangerous").Err(); err != nil {
		t.Fatal(err)
	}

	tlsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
	newClient := func(user, pass string) *redis.Client {
		rdb := redis.NewClient(&redis.Options{
			Addr: tlsAddr, Username: user, Password: pass,
			TLSConfig: &tls.Config{RootCAs: c.caPool, Certificates: []tls.Certificate{c.clientCert}, MinVersion: tls.VersionTLS12},
		})
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}
	rdb := newClient("tideapp", password)
	if err := rdb.Set(ctx, "elsewhere", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("the ACL user wrote outside its prefix: %v", err)
	}

	b := redisbroker.New(rdb, redisbroker.WithPrefix(prefix))
	cl := tide.NewClient(b)
	done := make(chan string, 1)
	s := tide.NewServer(b, tide.Config{Logger: testLogger(t), LeaseDuration: time.Second})
	if err := s.Start(tide.HandlerFunc(func(_ context.Context, task *tide.Task) error {
		done <- string(task.Payload())
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	if _, err := cl.Enqueue(ctx, tide.NewTask("secure", []byte("over tls")), tide.ProcessIn(100*time.Millisecond)); err != nil {
		t.Fatalf("enqueue over TLS as ACL user: %v", err)
	}
	select {
	case p := <-done:
		if p != "over tls" {
			t.Fatalf("payload %q", p)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("task not processed over TLS")
	}
	in := tide.NewInspector(b)
	if _, err := in.QueueInfo(ctx, "default"); err != nil {
		t.Fatalf("inspector as ACL user: %v", err)
	}

	// A wrong password fails with an error that does not repeat it.
	bad := tide.NewClient(redisbroker.New(newClient("tideapp", "wrong-"+password), redisbroker.WithPrefix(prefix)))
	_, err := bad.Enqueue(ctx, tide.NewTask("x", nil))
	if err == nil {
		t.Fatal("enqueue with a wrong password succeeded")
	}
	if strings.Contains(err.Error(), password) {
		t.Fatalf("error reveals the password: %v", err)
	}
	// Without a client certificate the TLS handshake is refused.
	noCert := redis.NewClient(&redis.Options{Addr: tlsAddr, Username: "tideapp", Password: password,
		TLSConfig: &tls.Config{RootCAs: c.caPool, MinVersion: tls.VersionTLS12}, MaxRetries: -1})
	defer noCert.Close()
	if err := noCert.Ping(ctx).Err(); err == nil {
		t.Fatal("connected without a client certificate")
	}
}

// TestPayloadsStayOutOfLogs: a failing, retried, archived and panicking task
// leaves no trace of its payload in the server's logs at any level.
func TestPayloadsStayOutOfLogs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var logs testlog.Buffer
	const secret = "card=4111111111111111"
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var calls int
	var mu sync.Mutex
	e.server(tide.Config{Logger: log, RetryDelayFunc: tide.RetrySchedule(time.Millisecond)},
		tide.HandlerFunc(func(_ context.Context, task *tide.Task) error {
			mu.Lock()
			calls++
			n := calls
			mu.Unlock()
			if n == 1 {
				panic("boom")
			}
			return errors.New("declined")
		}))
	info, err := e.c.Enqueue(context.Background(), tide.NewTask("charge", []byte(secret)), tide.MaxRetry(2))
	if err != nil {
		t.Fatal(err)
	}
	e.waitState("default", info.ID, tide.StateArchived)
	out := logs.String()
	if !strings.Contains(out, info.ID) {
		t.Fatalf("logs do not mention the task at all; the test would prove nothing:\n%s", out)
	}
	if strings.Contains(out, secret) || strings.Contains(out, "4111111111111111") {
		t.Fatalf("the payload appears in the logs:\n%s", out)
	}
}
