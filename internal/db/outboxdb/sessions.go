package outboxdb

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Sessions are the statements on the console's sessions
// (sql/sessions.sql), rendered for one schema.
type Sessions struct {
	create, get, remove string
}

// Session is a console session as stored: who signed in, how, their
// groups at the identity provider, until when.
type Session struct {
	Name, Source, Credential string
	Groups                   []string
	Expires                  time.Time
}

// NewSessions renders the sessions' statements for schemaName (default
// "public").
func NewSessions(schemaName string) (Sessions, error) {
	n, err := quoted(schemaName)
	if err != nil {
		return Sessions{}, err
	}
	var s Sessions
	for name, dst := range map[string]*string{
		"session_create": &s.create, "session_get": &s.get, "session_delete": &s.remove,
	} {
		if *dst, err = render(name, n); err != nil {
			return Sessions{}, err
		}
	}
	return s, nil
}

// Create stores the session whose id has the digest id, and deletes the
// expired ones (session_create).
func (q Sessions) Create(ctx context.Context, db DB, id []byte, s Session) error {
	_, err := db.Exec(ctx, q.create, id, s.Name, s.Source, s.Credential, s.Groups, s.Expires)
	return err
}

// Get returns the unexpired session whose id has the digest id; ok is
// false when there is none (session_get).
func (q Sessions) Get(ctx context.Context, db DB, id []byte) (s Session, ok bool, err error) {
	err = db.QueryRow(ctx, q.get, id).Scan(&s.Name, &s.Source, &s.Credential, &s.Groups, &s.Expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return Session{}, false, nil
	}
	return s, err == nil, err
}

// Delete ends the session whose id has the digest id (session_delete).
func (q Sessions) Delete(ctx context.Context, db DB, id []byte) error {
	_, err := db.Exec(ctx, q.remove, id)
	return err
}
