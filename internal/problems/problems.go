// Package problems turns validation errors, one problem a line, into the
// lines a configuration report lists, each under the path of the setting or
// section it is about.
package problems

import (
	"errors"
	"strings"
)

// Under returns err's lines, each with at put in front ("breaker." and
// "failures must be ≥ 1" make "breaker.failures must be ≥ 1"); nil for a
// nil err. Empty lines are left out.
func Under(at string, err error) []string {
	if err == nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(err.Error(), "\n") {
		if line != "" {
			out = append(out, at+line)
		}
	}
	return out
}

// Errors is Under, each line an error.
func Errors(at string, err error) []error {
	var out []error
	for _, line := range Under(at, err) {
		out = append(out, errors.New(line))
	}
	return out
}
