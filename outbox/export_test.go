package outbox

// Hooks for the package's external tests.

const ClaimBegin = claimBegin

func ClaimSQL(s *Store) string         { return s.sql.claim }
func HoldingBySpanSQL(s *Store) string { return s.sql.holdingBySpan }
func HoldingByKeySQL(s *Store) string  { return s.sql.holdingByKey }

// Key check forms, to force one in tests.
type KeyCheckForm = keyCheckForm

const (
	KeyCheckBySpan = keyCheckBySpan
	KeyCheckByKey  = keyCheckByKey
)

func SetKeyCheck(s *Store, f keyCheckForm) { s.keyCheck = f }
func CleanupLockID(s *Store) int64         { return s.lockID }
