package containertest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Runtime is what a Dockerfile's final stage says about the container that
// runs: what deploy/Dockerfile and deploy/Dockerfile.local must agree on.
type Runtime struct {
	User        string
	Entrypoint  []string
	Cmd         []string
	Expose      []string
	Labels      map[string]string // values as written, ${ARG}s unexpanded
	Healthcheck string            // as written; empty without one
	StopSignal  string
	Copied      []string // where COPY puts files
}

// ReadRuntime reads the final stage (after the last FROM) of the
// Dockerfile at path. It knows the instructions those two files use, and
// refuses others, so that a new one is compared rather than missed.
func ReadRuntime(path string) (Runtime, error) {
	f, err := os.Open(path)
	if err != nil {
		return Runtime{}, err
	}
	defer f.Close()
	var lines []string // logical lines: continuations joined, comments dropped
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(cont)
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(line)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		return Runtime{}, err
	}
	last := -1
	for i, l := range lines {
		if strings.EqualFold(firstWord(l), "FROM") {
			last = i
		}
	}
	if last < 0 {
		return Runtime{}, fmt.Errorf("%s: no FROM", path)
	}
	rt := Runtime{Labels: map[string]string{}}
	for _, l := range lines[last+1:] {
		instr := strings.ToUpper(firstWord(l))
		args := strings.TrimSpace(l[len(instr):])
		switch instr {
		case "ARG":
		case "USER":
			rt.User = args
		case "EXPOSE":
			rt.Expose = append(rt.Expose, strings.Fields(args)...)
		case "ENTRYPOINT", "CMD":
			var v []string
			if err := json.Unmarshal([]byte(args), &v); err != nil {
				return rt, fmt.Errorf("%s: %s is not in exec (JSON) form: %s", path, instr, args)
			}
			if instr == "CMD" {
				rt.Cmd = v
			} else {
				rt.Entrypoint = v
			}
		case "LABEL":
			if err := labels(args, rt.Labels); err != nil {
				return rt, fmt.Errorf("%s: LABEL: %w", path, err)
			}
		case "HEALTHCHECK":
			rt.Healthcheck = args
		case "STOPSIGNAL":
			rt.StopSignal = args
		case "COPY":
			f := strings.Fields(args)
			rt.Copied = append(rt.Copied, f[len(f)-1])
		default:
			return rt, fmt.Errorf("%s: the final stage has %s, which the comparison does not know", path, instr)
		}
	}
	return rt, nil
}

func firstWord(s string) string {
	if i := strings.IndexAny(s, " \t"); i >= 0 {
		return s[:i]
	}
	return s
}

// labels reads key="value" pairs, values quoted.
func labels(s string, into map[string]string) error {
	s = strings.TrimSpace(s)
	for s != "" {
		key, rest, ok := strings.Cut(s, "=")
		if !ok || strings.ContainsAny(key, " \t") {
			return fmt.Errorf("want key=\"value\" pairs at %q", s)
		}
		v, err := strconv.QuotedPrefix(rest)
		if err != nil {
			return fmt.Errorf("the value of %s is not quoted: %w", key, err)
		}
		into[key], _ = strconv.Unquote(v)
		s = strings.TrimSpace(rest[len(v):])
	}
	return nil
}
