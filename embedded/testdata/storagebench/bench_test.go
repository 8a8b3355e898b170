// Storage-engine comparison for STORAGE.md, a separate module so that bbolt and pebble stay out
// of the main go.mod. Run: cd embedded/testdata/storagebench && go test -bench . -benchtime 500000x
package storagebench

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble"
	bolt "go.etcd.io/bbolt"
)

// Same shape as embedded's BenchmarkLogStore: 8 writers, each durable-appending batches of 100
// 1 KiB records (one queue send batch) and then deleting them (the ack), like a queue under load.
const (
	writers = 8
	batch   = 100
)

var body = make([]byte, 1024)

func run(b *testing.B, commit func(w, i int, keys [][]byte, del bool) error) {
	per := b.N/(writers*batch) + 1
	b.SetBytes(1024)
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				keys := make([][]byte, batch)
				for j := range keys {
					k := make([]byte, 12)
					binary.BigEndian.PutUint32(k, uint32(w))
					binary.BigEndian.PutUint64(k[4:], uint64(i*batch+j))
					keys[j] = k
				}
				if err := commit(w, i, keys, false); err != nil {
					b.Error(err)
					return
				}
				if err := commit(w, i, keys, true); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(per*writers*batch)/b.Elapsed().Seconds(), "msg/s")
}

func benchBolt(b *testing.B, sync bool) {
	db, err := bolt.Open(b.TempDir()+"/b.db", 0o600, &bolt.Options{NoSync: !sync, NoFreelistSync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	db.MaxBatchDelay = 0
	run(b, func(w, i int, keys [][]byte, del bool) error {
		return db.Batch(func(tx *bolt.Tx) error {
			bk, err := tx.CreateBucketIfNotExists([]byte(fmt.Sprint("q", w)))
			if err != nil {
				return err
			}
			for _, k := range keys {
				if del {
					err = bk.Delete(k)
				} else {
					err = bk.Put(k, body)
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
	})
}

func benchPebble(b *testing.B, sync bool) {
	db, err := pebble.Open(b.TempDir(), &pebble.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	opt := pebble.NoSync
	if sync {
		opt = pebble.Sync
	}
	run(b, func(w, i int, keys [][]byte, del bool) error {
		bt := db.NewBatch()
		for _, k := range keys {
			if del {
				bt.Delete(k, nil)
			} else {
				bt.Set(k, body, nil)
			}
		}
		return bt.Commit(opt)
	})
}

func BenchmarkBoltNoSync(b *testing.B)   { benchBolt(b, false) }
func BenchmarkBoltSync(b *testing.B)     { benchBolt(b, true) }
func BenchmarkPebbleNoSync(b *testing.B) { benchPebble(b, false) }
func BenchmarkPebbleSync(b *testing.B)   { benchPebble(b, true) }
