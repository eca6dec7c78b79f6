package config

import (
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Redact removes the password of dsn from s, and a whole dsn that carries
// a password, so that errors and logs never show it.
func Redact(s, dsn string) string {
	if dsn == "" {
		return s
	}
	for _, secret := range passwords(dsn) {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "xxxxx")
		}
	}
	return s
}

// RedactURL returns dsn with its password replaced, for display.
func RedactURL(dsn string) string { return Redact(dsn, dsn) }

func passwords(dsn string) []string {
	var out []string
	// The driver's own parser understands every form (quoted values,
	// escapes, URL encoding).
	if pc, err := pgconn.ParseConfig(dsn); err == nil && pc.Password != "" {
		out = append(out, pc.Password, url.QueryEscape(pc.Password), url.PathEscape(pc.Password))
	}
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok {
			out = append(out, pw, url.QueryEscape(pw), url.PathEscape(pw))
		}
		if pw := u.Query().Get("password"); pw != "" {
			out = append(out, pw, url.QueryEscape(pw))
		}
	}
	// Forms the parsers reject, found by pattern: everything between the
	// user and the last @ of a URL (a password with an unescaped @), and
	// key=value passwords, quoted or with escapes, spaces around the =.
	if m := urlPassword.FindStringSubmatch(dsn); m != nil {
		out = append(out, m[1])
		// The driver may have masked the part before the @ already.
		out = append(out, longParts(m[1])...)
	}
	for _, m := range kvPassword.FindAllStringSubmatch(dsn, -1) {
		v := m[1]
		out = append(out, v, strings.Trim(v, "'"), strings.ReplaceAll(v, `\`, ""))
		// Words after the value without an = of their own were meant as
		// part of it (an unquoted space); the driver reports them alone.
		out = append(out, longParts(v+" "+m[2])...)
	}
	// Longest first, so a short secret inside a longer one does not leave
	// the rest of the longer one visible.
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

var (
	urlPassword = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://[^:/@]*:(.+)@[^@]*$`)
	kvPassword  = regexp.MustCompile(`(?i)\b(?:ssl)?password\s*=\s*('(?:[^'\\]|\\.)*'|(?:[^\s'\\]|\\.)+)((?:\s+[^\s=]+(?:\s|$))*)`)
)

// longParts splits a secret at punctuation and spaces and returns the
// parts long enough to be worth hiding on their own.
func longParts(s string) []string {
	var out []string
	for _, p := range strings.FieldsFunc(s, func(r rune) bool {
		return r == '@' || r == '\\' || r == '\'' || r == ' ' || r == '\t'
	}) {
		if len(p) >= 3 {
			out = append(out, p)
		}
	}
	return out
}
