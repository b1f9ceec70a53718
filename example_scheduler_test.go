package tide_test

import (
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
)

// Run the same scheduler in every replica of a service: each tick is still
// enqueued once. Servers process the tasks like any other.
func ExampleScheduler() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	s := tide.NewScheduler(redisbroker.New(rdb), &tide.SchedulerOpts{
		Location: time.UTC, // the default, for specs without CRON_TZ=
	})

	// Every 30 seconds, at :00 and :30 of each minute.
	if _, err := s.Register("@every 30s", tide.NewTask("metrics:flush", nil)); err != nil {
		log.Fatal(err)
	}
	// 09:00 on weekdays in Berlin; 5 fields (seconds are optional).
	if _, err := s.Register("CRON_TZ=Europe/Berlin 0 9 * * MON-FRI",
		tide.NewTask("report:daily", []byte(`{"format":"pdf"}`)),
		tide.Queue("reports"), tide.MaxRetry(3)); err != nil {
		log.Fatal(err)
	}
	if err := s.Run(); err != nil { // until SIGINT or SIGTERM
		log.Fatal(err)
	}
}

// A named entry that catches up after downtime: if no scheduler ran at
// 02:00, the tick is enqueued once when one starts (before the next 02:00).
func ExampleScheduler_RegisterEntry() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	s := tide.NewScheduler(redisbroker.New(rdb), nil)
	id, err := s.RegisterEntry(tide.CronEntry{
		ID:      "billing:nightly",
		Spec:    "0 2 * * *",
		Task:    tide.NewTask("billing:invoice", nil),
		Misfire: tide.MisfireRunOnce,
	})
	if err != nil {
		log.Fatal(err)
	}
	// Tasks get the IDs "cron:billing:nightly:<tick in Unix ms>".
	log.Printf("registered %s", id)
	if err := s.Start(); err != nil {
		log.Fatal(err)
	}
	defer s.Shutdown()
	// ... run the service ...
}
