package flow

// Why rows are deferred: the reason of a Deferred outcome.
const (
	// DeferKeyWaiting: an earlier row of the key waits for a retry, a
	// delay, or a parked key's release.
	DeferKeyWaiting = "key_waiting"
	// DeferCircuitOpen: the destination's circuit breaker is open.
	DeferCircuitOpen = "circuit_open"
	// DeferRetryBudget: the destination's retries are over budget.
	DeferRetryBudget = "retry_budget"
	// DeferDestinationFailing: the attempt failed in a way that says the
	// destination as a whole cannot be used (a systemic failure).
	DeferDestinationFailing = "destination_failing"
	// DeferTopicPaused: the row's topic is paused, or its attempt failed
	// in a way that says the topic cannot be used now (a systemic failure
	// of the topic, such as its authorization).
	DeferTopicPaused = "topic_paused"
	// DeferPartitionPaused: likewise for the row's partition (no leader).
	DeferPartitionPaused = "partition_paused"
)

// The dead-letter policies of a destination (on_dead_letter).
const (
	// OnDeadLetterRelease lets a key's later rows go on after one of its
	// rows is dead-lettered.
	OnDeadLetterRelease = "release"
	// OnDeadLetterBlock parks the key at a dead-lettered row until an
	// operator releases it.
	OnDeadLetterBlock = "block"
)
