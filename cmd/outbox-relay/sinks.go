package main

// The sinks destinations may use; each registers itself (see relay/sink).
import _ "github.com/outbox-relay/outbox-relay/relay/sink/builtin"
