package oneshot

import (
	"regexp"
	"strings"
)

// Java cells may be snippets, as in jshell (and E2B's Java kernel):
// statements, declarations of methods and variables, imports and a last
// expression, without a class. javaSnippet wraps such a cell into a
// program: imports first, methods as static members of class Main, the
// rest in Main.main, and the last expression's value written to
// javaResultFile, which the kernel reports as the cell's result.

// javaResultFile is where a wrapped snippet writes its last expression's
// value, in the work directory.
const javaResultFile = ".kiln-result"

// javaTypeDecl finds a top-level type declaration: such a cell is a
// program, compiled as it is.
var javaTypeDecl = regexp.MustCompile(`^(?:(?:public|private|protected|static|final|abstract|sealed|non-sealed|strictfp)\s+)*(?:class|interface|enum|record|@interface)\s`)

// javaMethod matches what comes before a method body's brace.
var javaMethod = regexp.MustCompile(`^(?:(?:public|private|protected|static|final|abstract|synchronized|native|strictfp)\s+)*(?:<[^>]*>\s*)?[A-Za-z_$][\w$.]*(?:<[^;{}()]*>)?(?:\[\])*\s+([A-Za-z_$][\w$]*)\s*\([^;{}]*\)\s*(?:throws\s+[\w$.,\s]+)?$`)

// javaNotMethod are words a statement may start with that javaMethod
// would take for a return type.
var javaNotMethod = map[string]bool{"return": true, "new": true, "else": true, "throw": true, "case": true, "yield": true}

// javaChunks splits src at its top-level statement ends: a ';' or a '}'
// at brace depth 0, outside strings, characters and comments. The rest
// after the last end is the last chunk (possibly blank).
func javaChunks(src string) []string {
	var chunks []string
	depth, start := 0, 0
	for i := 0; i < len(src); i++ {
		switch c := src[i]; {
		case c == '/' && i+1 < len(src) && src[i+1] == '/':
			for i < len(src) && src[i] != '\n' {
				i++
			}
		case c == '/' && i+1 < len(src) && src[i+1] == '*':
			end := strings.Index(src[i+2:], "*/")
			if end < 0 {
				i = len(src)
			} else {
				i += end + 3
			}
		case strings.HasPrefix(src[i:], `"""`):
			end := strings.Index(src[i+3:], `"""`)
			if end < 0 {
				i = len(src)
			} else {
				i += end + 5
			}
		case c == '"' || c == '\'':
			for i++; i < len(src) && src[i] != c && src[i] != '\n'; i++ {
				if src[i] == '\\' {
					i++
				}
			}
		case c == '{' || c == '(' || c == '[':
			depth++
		case c == ')' || c == ']':
			depth = max(depth-1, 0)
		case c == '}':
			depth = max(depth-1, 0)
			if depth == 0 {
				chunks = append(chunks, src[start:i+1])
				start = i + 1
			}
		case c == ';' && depth == 0:
			chunks = append(chunks, src[start:i+1])
			start = i + 1
		}
	}
	return append(chunks, src[min(start, len(src)):])
}

// javaSnippet returns the program for a Java cell: the cell itself if it
// declares a type, else the snippet wrapped (see above); asStatement
// makes a last expression a statement instead of the result (for calls
// of void methods).
func javaSnippet(code string, asStatement bool) (string, bool) {
	chunks := javaChunks(code)
	for _, c := range chunks {
		if javaTypeDecl.MatchString(strings.TrimSpace(stripJavaComments(c))) {
			return code, false
		}
	}
	var imports, members, body strings.Builder
	last := strings.TrimSpace(stripJavaComments(chunks[len(chunks)-1]))
	for _, c := range chunks[:len(chunks)-1] {
		t := strings.TrimSpace(stripJavaComments(c))
		switch {
		case strings.HasPrefix(t, "import ") && strings.HasSuffix(t, ";"):
			imports.WriteString(t + "\n")
		case strings.HasSuffix(t, "}") && isJavaMethod(t):
			if !strings.Contains(t[:strings.Index(t, "(")], "static") {
				members.WriteString("static ")
			}
			members.WriteString(t + "\n")
		default:
			body.WriteString(c)
		}
	}
	switch {
	case last == "":
	case asStatement:
		body.WriteString("\n" + last + ";")
	default:
		body.WriteString("\n__kiln_result(" + last + ");")
	}
	return imports.String() +
		"class Main {\n" + members.String() +
		"static void __kiln_result(Object v) throws Exception {\n" +
		"  java.nio.file.Files.writeString(java.nio.file.Path.of(\"" + javaResultFile + "\"), String.valueOf(v));\n}\n" +
		"public static void main(String[] args) throws Exception {\n" + body.String() + "\n}\n}\n", last != "" && !asStatement
}

// isJavaMethod reports whether a top-level chunk ending in a block is a
// method declaration.
func isJavaMethod(chunk string) bool {
	head := strings.TrimSpace(chunk[:strings.IndexByte(chunk, '{')])
	m := javaMethod.FindStringSubmatch(head)
	if m == nil {
		return false
	}
	first, _, _ := strings.Cut(head, " ")
	return !javaNotMethod[first] && !javaNotMethod[m[1]] && m[1] != "if" && m[1] != "for" && m[1] != "while" &&
		m[1] != "switch" && m[1] != "catch" && m[1] != "synchronized"
}

// stripJavaComments removes leading comments and blank lines, which do
// not change what a chunk declares.
func stripJavaComments(s string) string {
	for {
		s = strings.TrimLeft(s, " \t\r\n")
		switch {
		case strings.HasPrefix(s, "//"):
			_, s, _ = strings.Cut(s, "\n")
		case strings.HasPrefix(s, "/*"):
			_, s, _ = strings.Cut(s, "*/")
		default:
			return s
		}
	}
}
