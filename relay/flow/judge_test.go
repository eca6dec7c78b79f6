package flow

import (
	"errors"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// Every way a failed row's outcome is decided, from the row, its error and
// what settling knows about the probe it rode.
func TestJudgeDecidesEachFailedRow(t *testing.T) {
	t.Parallel()
	policy, err := retry.NewPolicy(retry.PolicyConfig{MaxAttempts: 5, MaxAge: time.Hour,
		Strategy: retry.StrategyNone, BaseDelay: time.Second, MaxDelay: time.Minute, MaxRetryAfter: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	topic := subject{"orders", wholeTopic}
	part3 := subject{"orders", 3}
	type want struct {
		kind      store.OutcomeKind
		reason    string
		delay     time.Duration // Retried only
		park      bool
		class     string
		about     subject // when scoped
		scoped    bool
		evidence  failureKind
		permanent bool
		probed    bool
	}
	cases := []struct {
		name  string
		rec   sink.Record
		err   error
		age   time.Duration
		state scopeState
		want  want
	}{
		{name: "unclassified: a transient failure of the row, retried with backoff",
			rec: sink.Record{HasKey: true, Key: "k"}, err: boom,
			want: want{kind: store.Retried, delay: time.Second, class: "transient", evidence: rowFailure}},
		{name: "the third attempt backs off further",
			rec: sink.Record{RetryCount: 2}, err: boom,
			want: want{kind: store.Retried, delay: 4 * time.Second, class: "transient", evidence: rowFailure}},
		{name: "a Retry-After above the backoff wins",
			err:  sink.Transient(boom, 30*time.Second),
			want: want{kind: store.Retried, delay: 30 * time.Second, class: "transient", evidence: rowFailure}},
		{name: "a Retry-After is capped",
			err:  sink.Transient(boom, time.Hour),
			want: want{kind: store.Retried, delay: 10 * time.Minute, class: "transient", evidence: rowFailure}},
		{name: "the last attempt dead-letters",
			rec: sink.Record{RetryCount: 4}, err: boom,
			want: want{kind: store.DeadLettered, reason: sink.ReasonRetriesExhausted, class: "transient", evidence: rowFailure}},
		{name: "too old dead-letters whatever its attempts",
			err: boom, age: 2 * time.Hour,
			want: want{kind: store.DeadLettered, reason: sink.ReasonMaxAgeExceeded, class: "transient", evidence: rowFailure}},
		{name: "permanent dead-letters at once with its reason, and parks its key when keys block",
			rec: sink.Record{HasKey: true, Key: "k"}, err: sink.Permanent(boom, sink.ReasonTooLarge),
			state: scopeState{block: true},
			want:  want{kind: store.DeadLettered, reason: sink.ReasonTooLarge, park: true, class: "permanent", evidence: rowFailure, permanent: true}},
		{name: "a row without a key parks nothing",
			err: sink.Permanent(boom, ""), state: scopeState{block: true},
			want: want{kind: store.DeadLettered, reason: sink.ReasonPermanent, class: "permanent", evidence: rowFailure, permanent: true}},
		{name: "a permanent failure is the row's even when the sink scoped it to the topic",
			err:  &sink.Error{Class: sink.ClassPermanent, Scope: sink.ScopeTopic, Err: boom},
			want: want{kind: store.DeadLettered, reason: sink.ReasonPermanent, class: "permanent", evidence: rowFailure, permanent: true}},
		{name: "a permanent failure in a failed probe still dead-letters",
			err: sink.Permanent(boom, ""), state: scopeState{destProbeFailed: true},
			want: want{kind: store.DeadLettered, reason: sink.ReasonPermanent, class: "permanent", evidence: rowFailure, permanent: true}},
		{name: "systemic: the destination fails, the row waits without an attempt's backoff",
			err:  sink.Systemic(boom),
			want: want{kind: store.Deferred, reason: DeferDestinationFailing, class: "systemic", evidence: systemicFailure}},
		{name: "a transient failure of the destination counts towards its breaker",
			err:  sink.DestinationFailure(sink.ClassTransient, boom),
			want: want{kind: store.Retried, delay: time.Second, class: "transient", evidence: transientFailure}},
		{name: "a systemic failure of the topic pauses the topic",
			rec: sink.Record{Topic: "orders"}, err: sink.TopicFailure(sink.ClassSystemic, boom),
			want: want{kind: store.Deferred, reason: DeferTopicPaused, class: "systemic", evidence: systemicFailure, about: topic, scoped: true}},
		{name: "a systemic failure of a partition pauses the partition",
			rec: sink.Record{Topic: "orders"}, err: sink.PartitionFailure(sink.ClassSystemic, 3, boom),
			want: want{kind: store.Deferred, reason: DeferPartitionPaused, class: "systemic", evidence: systemicFailure, about: part3, scoped: true}},
		{name: "a partition the sink did not name is the topic's",
			rec: sink.Record{Topic: "orders"}, err: sink.PartitionFailure(sink.ClassSystemic, -1, boom),
			want: want{kind: store.Deferred, reason: DeferTopicPaused, class: "systemic", evidence: systemicFailure, about: topic, scoped: true}},
		{name: "a transient failure of a partition is retried and counts towards its pause",
			rec: sink.Record{Topic: "orders"}, err: sink.PartitionFailure(sink.ClassTransient, 3, boom),
			want: want{kind: store.Retried, delay: time.Second, class: "transient", evidence: transientFailure, about: part3, scoped: true}},
		{name: "in a failed probe of the destination the row waits and counts no attempt",
			rec: sink.Record{RetryCount: 4}, err: boom, state: scopeState{destProbeFailed: true},
			want: want{kind: store.Deferred, reason: DeferDestinationFailing, class: "transient", evidence: rowFailure, probed: true}},
		{name: "in a failed probe, a row past its age still dead-letters",
			err: boom, age: time.Hour, state: scopeState{destProbeFailed: true},
			want: want{kind: store.DeadLettered, reason: sink.ReasonMaxAgeExceeded, class: "transient", evidence: rowFailure, probed: true}},
		{name: "in a failed probe of its partition",
			rec: sink.Record{Topic: "orders"}, err: sink.PartitionFailure(sink.ClassTransient, 3, boom),
			state: scopeState{pauseProbeFailed: map[subject]bool{part3: true}},
			want:  want{kind: store.Deferred, reason: DeferPartitionPaused, class: "transient", evidence: transientFailure, about: part3, scoped: true, probed: true}},
		{name: "a partition's failure in a failed probe of its topic",
			rec: sink.Record{Topic: "orders"}, err: sink.PartitionFailure(sink.ClassTransient, 3, boom),
			state: scopeState{pauseProbeFailed: map[subject]bool{topic: true}},
			want:  want{kind: store.Deferred, reason: DeferPartitionPaused, class: "transient", evidence: transientFailure, about: part3, scoped: true, probed: true}},
		{name: "a failed probe of another partition says nothing of this row",
			rec: sink.Record{Topic: "orders"}, err: sink.PartitionFailure(sink.ClassTransient, 3, boom),
			state: scopeState{pauseProbeFailed: map[subject]bool{{"orders", 4}: true}},
			want:  want{kind: store.Retried, delay: time.Second, class: "transient", evidence: transientFailure, about: part3, scoped: true}},
		{name: "a row's own failure in a failed probe of its topic follows the policy",
			rec: sink.Record{Topic: "orders"}, err: boom,
			state: scopeState{pauseProbeFailed: map[subject]bool{topic: true}},
			want:  want{kind: store.Retried, delay: time.Second, class: "transient", evidence: rowFailure}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.rec.ID = 7
			c.state.destination, c.state.policy = "webhook", policy
			r := judge(c.rec, c.err, c.age, c.state)
			o := r.outcome
			if o.ID != 7 || o.Destination != "webhook" || !o.Attempted || o.Error != "boom" {
				t.Errorf("outcome %+v: want row 7, destination webhook, attempted, error boom", o)
			}
			got := want{kind: o.Kind, reason: o.Reason, park: o.ParkKey, class: o.Class, about: r.about, scoped: r.scoped,
				evidence: r.kind, permanent: r.permanent, probed: r.probed}
			if o.Kind == store.Retried {
				got.delay = o.Delay
			} else if o.Delay != 0 {
				t.Errorf("a %v outcome with a delay %v: only retries get theirs here", o.Kind, o.Delay)
			}
			if got != c.want {
				t.Errorf("judge:\n got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// The evidence a ruling adds to its subject.
func TestEvidenceCountsRulings(t *testing.T) {
	t.Parallel()
	var ev evidence
	ev.add(ruling{kind: rowFailure, permanent: true, outcome: store.Outcome{Error: "refused"}}, sink.Record{ID: 1})
	ev.add(ruling{kind: rowFailure, outcome: store.Outcome{Error: "503"}}, sink.Record{ID: 2})
	ev.add(ruling{kind: rowFailure, outcome: store.Outcome{Error: "503"}}, sink.Record{ID: 3, RetryCount: 1})
	ev.add(ruling{kind: systemicFailure, outcome: store.Outcome{Error: "auth"}}, sink.Record{ID: 4})
	ev.add(ruling{kind: transientFailure, outcome: store.Outcome{Error: "timeout"}}, sink.Record{ID: 5})
	want := evidence{rowFailed: []int64{1, 2, 3}, rowTransient: 2, rowFirsts: 1, systemic: 1, transient: 1, lastErr: "timeout"}
	if ev.systemic != want.systemic || ev.transient != want.transient || ev.rowTransient != want.rowTransient ||
		ev.rowFirsts != want.rowFirsts || ev.lastErr != want.lastErr || len(ev.rowFailed) != 3 {
		t.Errorf("evidence %+v, want %+v", ev, want)
	}
}
