package deadletter

import "encoding/json"

// What the dead-letter operations show of rows to a viewer, who may see
// everything about a message but its content: payloads are left out, and
// said to be.

// HidePayload leaves the payload out of d, and its version, a digest of
// the payload that would confirm a guess of it.
func (d *Detail) HidePayload() {
	d.Payload, d.Version, d.PayloadHidden = nil, "", true
}

// HidePayloads leaves out the payloads an edit's record keeps of the row
// before and after (whole or as a digest), and says so in the record.
func (a *AuditRecord) HidePayloads() {
	if len(a.Details) == 0 {
		return
	}
	var details map[string]json.RawMessage
	if json.Unmarshal(a.Details, &details) != nil {
		// Not an object: nothing in it is shown.
		a.Details, a.PayloadsHidden = nil, true
		return
	}
	hid := false
	for _, image := range []string{"before", "after"} {
		var fields map[string]json.RawMessage
		if json.Unmarshal(details[image], &fields) != nil {
			continue
		}
		for _, f := range []string{"payload", "payload_sha256", "payload_bytes"} {
			if _, ok := fields[f]; ok {
				delete(fields, f)
				hid = true
			}
		}
		details[image], _ = json.Marshal(fields)
	}
	if hid {
		a.Details, _ = json.Marshal(details)
		a.PayloadsHidden = true
	}
}

// HidePayloads leaves the payloads out of what f found.
func (f *Found) HidePayloads() {
	for i := range f.Audit {
		f.Audit[i].HidePayloads()
	}
	for i := range f.Rows {
		for j := range f.Rows[i].Audit {
			f.Rows[i].Audit[j].HidePayloads()
		}
	}
}

// HidePayloads leaves the payloads out of p's records.
func (p *AuditPage) HidePayloads() {
	for i := range p.Records {
		p.Records[i].HidePayloads()
	}
}
