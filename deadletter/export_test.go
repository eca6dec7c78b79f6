package deadletter

// For the tests of package deadletter_test.
var (
	ParseFind   = parseFind
	ParseCursor = parseCursor
)
