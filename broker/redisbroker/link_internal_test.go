package redisbroker

import "testing"

// BenchmarkLoadScripts is what linking every script costs a broker when it
// is made (New), counted in the CPU of every process that makes one.
func BenchmarkLoadScripts(b *testing.B) {
	b.ReportAllocs()
	for range b.N {
		loadScripts()
	}
}
