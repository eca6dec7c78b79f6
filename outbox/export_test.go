package outbox

// Hooks for the package's external tests.

const ClaimBegin = claimBegin

func ClaimSQL(s *Store) string     { return s.sql.claim }
func HoldingSQL(s *Store) string   { return s.sql.holding }
func CleanupLockID(s *Store) int64 { return s.lockID }
