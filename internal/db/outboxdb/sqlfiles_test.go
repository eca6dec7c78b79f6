package outboxdb

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// statement is how SQL text begins: a keyword in capitals (after comment
// lines), then more.
var statement = regexp.MustCompile(`^\s*(--[^\n]*\n\s*)*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|DROP|LOCK|LISTEN|NOTIFY|SAVEPOINT|ROLLBACK|BEGIN|COMMIT|SET|TRUNCATE|VACUUM|ANALYZE|COPY)\s`)

// Every statement the relay's packages run is in sql/*.sql, rendered with
// quoted names: no Go file outside the tests and the development tools
// holds SQL text.
func TestNoSQLOutsideTheSQLFiles(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module's root: %v", err)
	}
	// Tools that build throwaway databases and benchmarks, not the relay.
	dev := []string{".git", "bin", "internal/dev"}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			for _, skip := range dev {
				if rel == skip {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		checked++
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if s, err := strconv.Unquote(lit.Value); err == nil && statement.MatchString(s) {
				t.Errorf("%s: SQL in Go, %q: put it in internal/db/outboxdb/sql/*.sql", fset.Position(lit.Pos()), firstLine(s))
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked %d Go files: the walk is broken", checked)
	}
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}
