package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
)

// secretPrefix starts a Standard Webhooks secret.
const secretPrefix = "whsec_"

// decodeSecret returns the key of a whsec_<base64> secret.
func decodeSecret(s string) ([]byte, error) {
	b64, ok := strings.CutPrefix(strings.TrimSpace(s), secretPrefix)
	if !ok {
		return nil, errors.New("must start with " + secretPrefix)
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, errors.New("is not base64 after " + secretPrefix)
	}
	if len(key) < 24 {
		return nil, errors.New("is shorter than 24 bytes")
	}
	return key, nil
}

// Sign returns the webhook-signature value for a message: one v1
// signature per key, space-separated, over "<id>.<timestamp>.<body>"
// (Standard Webhooks).
func Sign(keys [][]byte, id string, timestamp int64, body []byte) string {
	content := make([]byte, 0, len(id)+len(body)+24)
	content = append(content, id...)
	content = append(content, '.')
	content = strconv.AppendInt(content, timestamp, 10)
	content = append(content, '.')
	content = append(content, body...)
	sigs := make([]string, 0, len(keys))
	for _, k := range keys {
		m := hmac.New(sha256.New, k)
		m.Write(content)
		sigs = append(sigs, "v1,"+base64.StdEncoding.EncodeToString(m.Sum(nil)))
	}
	return strings.Join(sigs, " ")
}
