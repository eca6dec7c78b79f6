package outboxdb

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// content builds a version-1 message as outbox_emit writes it; a nil key
// is none.
func content(topic string, key *string, headers, payload string) []byte {
	b := []byte{1}
	id := uuid.MustParse("01234567-89ab-cdef-0123-456789abcdef")
	b = append(b, id[:]...)
	b = binary.BigEndian.AppendUint64(b, 1_700_000_000_000_000)
	field := func(s string) { b = binary.BigEndian.AppendUint32(b, uint32(len(s))); b = append(b, s...) }
	field(topic)
	if key == nil {
		b = binary.BigEndian.AppendUint32(b, 0xffffffff)
	} else {
		field(*key)
	}
	field(headers)
	return append(b, payload...)
}

func TestDecodeLogMessage(t *testing.T) {
	t.Parallel()
	k := "order-1"
	m, err := DecodeLogMessage(content("orders", &k, `{"a": "b"}`, "payload"))
	if err != nil {
		t.Fatal(err)
	}
	if m.Topic != "orders" || !m.HasKey || m.Key != k || string(m.Headers) != `{"a": "b"}` || string(m.Payload) != "payload" ||
		m.CreatedAt.UnixMicro() != 1_700_000_000_000_000 || m.EventID.String() != "01234567-89ab-cdef-0123-456789abcdef" {
		t.Fatalf("decoded %+v", m)
	}
	m, err = DecodeLogMessage(content("orders", nil, "{}", ""))
	if err != nil || m.HasKey || len(m.Payload) != 0 {
		t.Fatalf("without a key or payload: %+v, %v", m, err)
	}
	full := content("orders", &k, "{}", "p")
	for name, c := range map[string]struct {
		in   []byte
		want string
	}{
		"empty":         {nil, "empty"},
		"newer":         {append([]byte{2}, full[1:]...), "unknown version"},
		"no event id":   {full[:10], "cut short"},
		"topic cut":     {full[:1+16+8+6], "cut short"},
		"empty topic":   {content("", &k, "{}", ""), "topic"},
		"key too long":  {append(full[:1+16+8+4+6], 0, 0, 1, 0), "cut short"},
		"headers cut":   {full[:len(full)-4], "cut short"},
		"invalid topic": {content("\xff", &k, "{}", ""), "topic"},
	} {
		_, err := DecodeLogMessage(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		}
		if name == "newer" && !errors.Is(err, ErrLogMessageVersion) {
			t.Errorf("newer: %v is not ErrLogMessageVersion", err)
		}
	}
}
