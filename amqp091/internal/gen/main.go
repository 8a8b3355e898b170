// Command gen generates amqp091/wire/methods_gen.go from the AMQP 0-9-1 XML
// specification (RabbitMQ's "stripped extended" edition, which adds
// confirm.select, exchange.bind/unbind, basic.nack, connection.blocked and
// connection.update-secret).
//
// The XML is not vendored: by default it is read from the module cache copy of
// github.com/rabbitmq/amqp091-go (a dependency of this module), located with
// `go list -m`. Run it through `go generate ./amqp091/wire`.
//
// Usage:
//
//	gen [-spec file.xml] [-o methods_gen.go]
//
// The output is deterministic (spec order, no maps iterated) and gofmt'ed.
package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"go/format"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	// The spec XML ships in this module's source tree. Importing it keeps the
	// module a direct requirement in go.mod (so `go mod tidy` cannot drop it)
	// and its source in the module cache for `go list -m` to find.
	_ "github.com/rabbitmq/amqp091-go"
)

// specModule is the module whose source tree carries the spec XML.
const (
	specModule = "github.com/rabbitmq/amqp091-go"
	specPath   = "spec/amqp0-9-1.stripped.extended.xml"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("gen: ")
	specFile := flag.String("spec", "", "spec XML file (default: "+specPath+" in the "+specModule+" module)")
	out := flag.String("o", "methods_gen.go", "output file")
	flag.Parse()

	xmlBytes, label, err := loadSpec(*specFile)
	if err != nil {
		log.Fatal(err)
	}
	src, err := generate(xmlBytes, label)
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*out, src, 0o644); err != nil {
		log.Fatal(err)
	}
}

// loadSpec reads the spec XML and returns it with a label naming its source
// for the generated header. An explicit file wins over the module lookup.
func loadSpec(file string) ([]byte, string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		return b, filepath.Base(file), err
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Path}}@{{.Version}}\t{{.Dir}}", specModule)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		return nil, "", fmt.Errorf("locating %s: %v: %s", specModule, err, strings.TrimSpace(stderr.String()))
	}
	modVer, dir, ok := strings.Cut(strings.TrimSpace(string(outb)), "\t")
	if !ok || dir == "" {
		return nil, "", fmt.Errorf("module %s has no source directory (run `go mod download %s`)", specModule, specModule)
	}
	b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(specPath)))
	return b, modVer + " " + specPath, err
}

// XML model: only what the codec needs.

type xmlSpec struct {
	Major     int           `xml:"major,attr"`
	Minor     int           `xml:"minor,attr"`
	Revision  int           `xml:"revision,attr"`
	Port      int           `xml:"port,attr"`
	Constants []xmlConstant `xml:"constant"`
	Domains   []xmlDomain   `xml:"domain"`
	Classes   []xmlClass    `xml:"class"`
}

type xmlConstant struct {
	Name  string `xml:"name,attr"`
	Value int    `xml:"value,attr"`
	Class string `xml:"class,attr"`
}

type xmlDomain struct {
	Name string `xml:"name,attr"`
	Type string `xml:"type,attr"`
}

type xmlClass struct {
	Name    string       `xml:"name,attr"`
	Index   int          `xml:"index,attr"`
	Fields  []xmlField   `xml:"field"`
	Methods []xmlMethod  `xml:"method"`
	Chassis []xmlChassis `xml:"chassis"`
}

type xmlMethod struct {
	Name      string        `xml:"name,attr"`
	Index     int           `xml:"index,attr"`
	Sync      int           `xml:"synchronous,attr"`
	Content   int           `xml:"content,attr"`
	Fields    []xmlField    `xml:"field"`
	Responses []xmlResponse `xml:"response"`
	Chassis   []xmlChassis  `xml:"chassis"`
}

type xmlField struct {
	Name     string `xml:"name,attr"`
	Domain   string `xml:"domain,attr"`
	Type     string `xml:"type,attr"`
	Reserved int    `xml:"reserved,attr"`
}

type xmlResponse struct {
	Name string `xml:"name,attr"`
}

type xmlChassis struct {
	Name string `xml:"name,attr"`
}

// Resolved model.

type field struct {
	wireName string // spec name, e.g. "routing-key"
	goName   string // "" for reserved fields, which are not exposed
	typ      string // AMQP primitive type
}

type method struct {
	class     *xmlClass
	name      string // "basic.publish"
	goName    string // "BasicPublish"
	classID   int
	methodID  int
	sync      bool
	content   bool
	toServer  bool
	toClient  bool
	fields    []field
	responses []string // full names, e.g. "basic.get-ok"
}

// goTypes maps AMQP primitive types to the Go types of method struct fields.
var goTypes = map[string]string{
	"bit":       "bool",
	"octet":     "uint8",
	"short":     "uint16",
	"long":      "uint32",
	"longlong":  "uint64",
	"shortstr":  "string",
	"longstr":   "string",
	"timestamp": "time.Time",
	"table":     "Table",
}

// fieldRenames avoids clashes with the Method interface (ClassID, MethodID)
// and says what the close fields mean: the method that caused the close.
var fieldRenames = map[string]string{
	"class-id":  "FailingClassID",
	"method-id": "FailingMethodID",
}

// propertyRenames gives the basic class's "reserved" property its historic
// name (cluster-id), which is how clients and RabbitMQ call it.
var propertyRenames = map[string]string{
	"reserved": "cluster-id",
}

// directionFixes corrects the XML's chassis for connection.update-secret
// (RabbitMQ's extension): the XML has it the wrong way round, but clients
// send update-secret (amqp091-go's Connection.UpdateSecret, amqplib's
// updateSecret) and RabbitMQ answers update-secret-ok.
var directionFixes = map[string][2]bool{ // name -> {toServer, toClient}
	"connection.update-secret":    {true, false},
	"connection.update-secret-ok": {false, true},
}

// responseFixes adds replies the XML leaves out: basic.recover is answered by
// basic.recover-ok.
var responseFixes = map[string][]string{
	"basic.recover": {"basic.recover-ok"},
}

// secretFields are redacted by String() so logs never carry credentials.
var secretFields = map[string]bool{
	"response":   true, // connection.start-ok / secure-ok SASL response
	"new-secret": true, // connection.update-secret
}

// interfaceMethods are the Method interface's method names; a field must not
// take one of them.
var interfaceMethods = map[string]bool{
	"ClassID": true, "MethodID": true, "Name": true, "String": true,
	"HasContent": true, "Sync": true,
}

// goName converts a dashed spec name to an exported Go identifier.
func goName(parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		for _, w := range strings.FieldsFunc(p, func(r rune) bool { return r == '-' || r == '.' || r == '_' }) {
			switch w {
			case "id":
				b.WriteString("ID")
			case "nowait":
				b.WriteString("NoWait")
			default:
				b.WriteString(strings.ToUpper(w[:1]) + w[1:])
			}
		}
	}
	return b.String()
}

// upperName converts "not-found" to "NOT_FOUND", RabbitMQ's reply-text prefix.
func upperName(s string) string {
	return strings.ToUpper(strings.ReplaceAll(s, "-", "_"))
}

func hasChassis(cs []xmlChassis, name string) bool {
	for _, c := range cs {
		if c.Name == name {
			return true
		}
	}
	return false
}

func resolve(spec *xmlSpec) ([]method, error) {
	domains := map[string]string{}
	for _, d := range spec.Domains {
		domains[d.Name] = d.Type
	}
	fieldType := func(f xmlField) (string, error) {
		t := f.Type
		if t == "" {
			t = domains[f.Domain]
		}
		// Domains may be defined in terms of primitive types of the same name.
		if dt, ok := domains[t]; ok && dt != "" {
			t = dt
		}
		if _, ok := goTypes[t]; !ok {
			return "", fmt.Errorf("field %q: unknown type %q (domain %q)", f.Name, t, f.Domain)
		}
		return t, nil
	}

	var out []method
	for ci := range spec.Classes {
		c := &spec.Classes[ci]
		for _, xm := range c.Methods {
			m := method{
				class:    c,
				name:     c.Name + "." + xm.Name,
				goName:   goName(c.Name, xm.Name),
				classID:  c.Index,
				methodID: xm.Index,
				sync:     xm.Sync == 1,
				content:  xm.Content == 1,
				toServer: hasChassis(xm.Chassis, "server"),
				toClient: hasChassis(xm.Chassis, "client"),
			}
			for _, r := range xm.Responses {
				m.responses = append(m.responses, c.Name+"."+r.Name)
			}
			if fix, ok := directionFixes[m.name]; ok {
				m.toServer, m.toClient = fix[0], fix[1]
			}
			if fix, ok := responseFixes[m.name]; ok && len(m.responses) == 0 {
				m.responses = fix
			}
			for _, xf := range xm.Fields {
				t, err := fieldType(xf)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", m.name, err)
				}
				f := field{wireName: xf.Name, typ: t}
				if xf.Reserved != 1 {
					f.goName = goName(xf.Name)
					if r, ok := fieldRenames[xf.Name]; ok {
						f.goName = r
					}
					if interfaceMethods[f.goName] {
						return nil, fmt.Errorf("%s: field %q clashes with a Method interface method", m.name, xf.Name)
					}
				}
				m.fields = append(m.fields, f)
			}
			out = append(out, m)
		}
	}
	// Responses must name methods that exist.
	names := map[string]bool{}
	for _, m := range out {
		names[m.name] = true
	}
	for _, m := range out {
		for _, r := range m.responses {
			if !names[r] {
				return nil, fmt.Errorf("%s: response %q is not a method", m.name, r)
			}
		}
	}
	return out, nil
}

type gen struct {
	bytes.Buffer
}

func (g *gen) p(format string, args ...any) {
	fmt.Fprintf(&g.Buffer, format, args...)
	g.WriteByte('\n')
}

func generate(xmlBytes []byte, label string) ([]byte, error) {
	var spec xmlSpec
	if err := xml.Unmarshal(xmlBytes, &spec); err != nil {
		return nil, fmt.Errorf("parsing spec: %w", err)
	}
	if spec.Major != 0 || spec.Minor != 9 || spec.Revision != 1 {
		return nil, fmt.Errorf("spec is AMQP %d-%d-%d, want 0-9-1", spec.Major, spec.Minor, spec.Revision)
	}
	methods, err := resolve(&spec)
	if err != nil {
		return nil, err
	}
	var basic *xmlClass
	for i := range spec.Classes {
		if spec.Classes[i].Name == "basic" {
			basic = &spec.Classes[i]
		}
	}
	if basic == nil || len(basic.Fields) == 0 || len(basic.Fields) > 15 {
		return nil, errors.New("spec has no basic class properties, or more than fit one flag word")
	}

	g := &gen{}
	g.p("// Code generated by amqp091/internal/gen from %s; DO NOT EDIT.", label)
	g.p("")
	g.p("package wire")
	g.p("")
	g.p(`import (`)
	g.p(`"fmt"`)
	if usesTime(methods) {
		g.p(`"time"`)
	}
	g.p(`)`)
	g.p("")
	genConstants(g, &spec)
	genReplyCodes(g, &spec)
	genClasses(g, &spec)
	genPropertyFlags(g, basic)
	genMethodInfo(g, methods)
	for i := range methods {
		genMethod(g, &methods[i])
	}
	src, err := format.Source(g.Bytes())
	if err != nil {
		return nil, fmt.Errorf("formatting generated code: %w\n%s", err, g.Bytes())
	}
	return src, nil
}

func usesTime(ms []method) bool {
	for _, m := range ms {
		for _, f := range m.fields {
			if f.typ == "timestamp" && f.goName != "" {
				return true
			}
		}
	}
	return false
}

func genConstants(g *gen, spec *xmlSpec) {
	g.p("// Protocol version and default port from the spec.")
	g.p("const (")
	g.p("ProtocolMajor = %d", spec.Major)
	g.p("ProtocolMinor = %d", spec.Minor)
	g.p("ProtocolRevision = %d", spec.Revision)
	g.p("DefaultPort = %d", spec.Port)
	g.p(")")
	g.p("")
	g.p("// Frame constants from the spec.")
	g.p("const (")
	for _, c := range spec.Constants {
		if !strings.HasPrefix(c.Name, "frame-") || c.Class != "" { // frame-error is a reply code
			continue
		}
		switch c.Name {
		case "frame-min-size":
			g.p("// FrameMinSize is the smallest frame-max a peer may negotiate; frames up to")
			g.p("// this size are always acceptable, also before tuning.")
			g.p("FrameMinSize = %d", c.Value)
		case "frame-end":
			g.p("// FrameEnd terminates every frame.")
			g.p("FrameEnd = %d", c.Value)
		default:
			g.p("%s FrameType = %d", goName(c.Name), c.Value)
		}
	}
	g.p(")")
	g.p("")
}

func genReplyCodes(g *gen, spec *xmlSpec) {
	type rc struct {
		name  string
		value int
		hard  bool
	}
	var codes []rc
	for _, c := range spec.Constants {
		if c.Class == "soft-error" || c.Class == "hard-error" || c.Name == "reply-success" {
			codes = append(codes, rc{c.Name, c.Value, c.Class == "hard-error"})
		}
	}
	g.p("// Reply codes from the spec, used in connection.close, channel.close and")
	g.p("// basic.return.")
	g.p("const (")
	for _, c := range codes {
		level := "soft (channel) error"
		if c.hard {
			level = "hard (connection) error"
		}
		if c.name == "reply-success" {
			level = "success"
		}
		g.p("Reply%s uint16 = %d // %s: %s", goName(strings.TrimPrefix(c.name, "reply-")), c.value, upperName(c.name), level)
	}
	g.p(")")
	g.p("")
	g.p("// ReplyName returns the spec name of a reply code as RabbitMQ spells it in")
	g.p("// reply texts (\"NOT_FOUND\"), or \"\" for a code the spec does not define.")
	g.p("func ReplyName(code uint16) string {")
	g.p("switch code {")
	for _, c := range codes {
		g.p("case %d:", c.value)
		g.p("return %q", upperName(c.name))
	}
	g.p("}")
	g.p(`return ""`)
	g.p("}")
	g.p("")
	g.p("// IsHardError reports whether the spec classes code as a hard error, one that")
	g.p("// closes the connection rather than the channel. Unknown codes are hard:")
	g.p("// closing more than needed is the safe side.")
	g.p("func IsHardError(code uint16) bool {")
	g.p("switch code {")
	var soft []string
	for _, c := range codes {
		if !c.hard {
			soft = append(soft, fmt.Sprint(c.value))
		}
	}
	g.p("case %s:", strings.Join(soft, ", "))
	g.p("return false")
	g.p("}")
	g.p("return true")
	g.p("}")
	g.p("")
	g.p("// errorCodes lists every error reply code of the spec, in spec order.")
	g.p("var errorCodes = []uint16{")
	for _, c := range codes {
		if c.name != "reply-success" {
			g.p("Reply%s,", goName(c.name))
		}
	}
	g.p("}")
	g.p("")
}

func genClasses(g *gen, spec *xmlSpec) {
	g.p("// Class ids.")
	g.p("const (")
	for _, c := range spec.Classes {
		g.p("Class%s uint16 = %d", goName(c.Name), c.Index)
	}
	g.p(")")
	g.p("")
	g.p("// Method ids, unique only within their class.")
	g.p("const (")
	for _, c := range spec.Classes {
		for _, m := range c.Methods {
			g.p("Method%s uint16 = %d // %s.%s", goName(c.Name, m.Name), m.Index, c.Name, m.Name)
		}
	}
	g.p(")")
	g.p("")
}

func genPropertyFlags(g *gen, basic *xmlClass) {
	g.p("// Basic content-header property flags, one bit per property from bit 15")
	g.p("// down, in wire order. Bit 0 is the continuation bit, never used by basic.")
	g.p("const (")
	for i, f := range basic.Fields {
		name := f.Name
		if r, ok := propertyRenames[name]; ok {
			name = r
		}
		g.p("Flag%s PropertyFlags = 1 << %d // %s (%s)", goName(name), 15-i, name, f.Domain)
	}
	g.p(")")
	g.p("")
	g.p("// propertyFlagNames names the flags above, highest bit first.")
	g.p("var propertyFlagNames = [...]string{")
	for _, f := range basic.Fields {
		name := f.Name
		if r, ok := propertyRenames[name]; ok {
			name = r
		}
		g.p("%q,", name)
	}
	g.p("}")
	g.p("")
}

func genMethodInfo(g *gen, methods []method) {
	g.p("// methodInfos describes every method of the spec, in spec order.")
	g.p("var methodInfos = [...]MethodInfo{")
	for _, m := range methods {
		var resp []string
		for _, r := range m.responses {
			for _, o := range methods {
				if o.name == r {
					resp = append(resp, fmt.Sprintf("{%d, %d}", o.classID, o.methodID))
				}
			}
		}
		respStr := "nil"
		if len(resp) > 0 {
			respStr = "[]MethodKey{" + strings.Join(resp, ", ") + "}"
		}
		g.p("{Key: MethodKey{%d, %d}, Name: %q, Sync: %t, Content: %t, ToServer: %t, ToClient: %t, Responses: %s},",
			m.classID, m.methodID, m.name, m.sync, m.content, m.toServer, m.toClient, respStr)
	}
	g.p("}")
	g.p("")
	g.p("// methodIndex maps a method key to its index in methodInfos, or -1.")
	g.p("func methodIndex(class, method uint16) int {")
	g.p("switch uint32(class)<<16 | uint32(method) {")
	for i, m := range methods {
		g.p("case %d<<16 | %d:", m.classID, m.methodID)
		g.p("return %d", i)
	}
	g.p("}")
	g.p("return -1")
	g.p("}")
	g.p("")
	g.p("// newMethod returns a zero method struct for a method key, or nil if the")
	g.p("// spec has no such method. It is the decoder dispatch table.")
	g.p("func newMethod(class, method uint16) Method {")
	g.p("switch uint32(class)<<16 | uint32(method) {")
	for _, m := range methods {
		g.p("case %d<<16 | %d:", m.classID, m.methodID)
		g.p("return new(%s)", m.goName)
	}
	g.p("}")
	g.p("return nil")
	g.p("}")
	g.p("")
	g.p("// zeroMethods returns one zero value of every method type, in spec order.")
	g.p("func zeroMethods() []Method {")
	g.p("return []Method{")
	for _, m := range methods {
		g.p("new(%s),", m.goName)
	}
	g.p("}")
	g.p("}")
	g.p("")
}

// bitGroups returns, per field index, the octet group of a bit field and the
// bit position in it. Consecutive bits share octets, eight to an octet.
func bitPositions(fs []field) (pos []int, groupStart []bool) {
	pos = make([]int, len(fs))
	groupStart = make([]bool, len(fs))
	n := 0
	for i, f := range fs {
		if f.typ != "bit" {
			n = 0
			continue
		}
		if n == 8 {
			n = 0
		}
		groupStart[i] = n == 0
		pos[i] = n
		n++
	}
	return pos, groupStart
}

func genMethod(g *gen, m *method) {
	// Type and doc.
	g.p("// %s is %s (class %d, method %d).", m.goName, m.name, m.classID, m.methodID)
	var notes []string
	if m.sync {
		notes = append(notes, "synchronous")
	} else {
		notes = append(notes, "asynchronous")
	}
	if m.content {
		notes = append(notes, "carries content")
	}
	switch {
	case m.toServer && m.toClient:
		notes = append(notes, "sent by either peer")
	case m.toServer:
		notes = append(notes, "sent by the client")
	case m.toClient:
		notes = append(notes, "sent by the server")
	}
	line := "// It is " + strings.Join(notes, ", ") + "."
	if len(m.responses) > 0 {
		line += " The reply is " + strings.Join(m.responses, " or ") + "."
	}
	g.p("%s", line)
	g.p("type %s struct {", m.goName)
	for _, f := range m.fields {
		if f.goName == "" {
			continue
		}
		g.p("%s %s // %s (%s)", f.goName, goTypes[f.typ], f.wireName, f.typ)
	}
	g.p("}")
	g.p("")
	recv := "*" + m.goName
	g.p("// ClassID returns %d (%s).", m.classID, m.class.Name)
	g.p("func (%s) ClassID() uint16 { return %d }", recv, m.classID)
	g.p("")
	g.p("// MethodID returns %d.", m.methodID)
	g.p("func (%s) MethodID() uint16 { return %d }", recv, m.methodID)
	g.p("")
	g.p("// Name returns %q.", m.name)
	g.p("func (%s) Name() string { return %q }", recv, m.name)
	g.p("")
	g.p("// HasContent reports whether a content header and body frames follow.")
	g.p("func (%s) HasContent() bool { return %t }", recv, m.content)
	g.p("")
	g.p("// Sync reports whether the spec marks the method synchronous.")
	g.p("func (%s) Sync() bool { return %t }", recv, m.sync)
	g.p("")

	// String.
	var fmts []string
	var args []string
	for _, f := range m.fields {
		if f.goName == "" {
			continue
		}
		if secretFields[f.wireName] {
			fmts = append(fmts, f.wireName+"=<%d bytes>")
			args = append(args, "len(m."+f.goName+")")
			continue
		}
		verb := "%v"
		switch f.typ {
		case "shortstr", "longstr":
			verb = "%q"
		case "bit":
			verb = "%t"
		case "octet", "short", "long", "longlong":
			verb = "%d"
		}
		fmts = append(fmts, f.wireName+"="+verb)
		args = append(args, "m."+f.goName)
	}
	g.p("// String describes the method for logs; secrets are redacted.")
	if len(args) == 0 {
		g.p("func (%s) String() string { return %q }", recv, m.name+"{}")
	} else {
		g.p("func (m %s) String() string {", recv)
		g.p("return fmt.Sprintf(%q, %s)", m.name+"{"+strings.Join(fmts, " ")+"}", strings.Join(args, ", "))
		g.p("}")
	}
	g.p("")

	pos, start := bitPositions(m.fields)

	// Encoder.
	used := false
	for _, f := range m.fields {
		if f.goName != "" {
			used = true
		}
	}
	mv := "m " + recv
	if !used {
		mv = recv
	}
	if len(m.fields) == 0 {
		g.p("func (%s) encodeArgs(e encoder) encoder { return e }", recv)
	} else {
		g.p("func (%s) encodeArgs(e encoder) encoder {", mv)
		for i, f := range m.fields {
			if f.typ == "bit" {
				gi := groupOf(start, i)
				named := groupUsed(m.fields, start, gi)
				if start[i] && named {
					g.p("var bits%d uint8", i)
				}
				if f.goName != "" {
					g.p("if m.%s {", f.goName)
					g.p("bits%d |= 1 << %d", gi, pos[i])
					g.p("}")
				}
				if i+1 == len(m.fields) || m.fields[i+1].typ != "bit" || pos[i] == 7 {
					if named {
						g.p("e.octet(bits%d)", gi)
					} else {
						g.p("e.octet(0) // reserved bits")
					}
				}
				continue
			}
			val := "m." + f.goName
			if f.goName == "" {
				val = zeroValue(f.typ)
			}
			g.p("e.%s(%s)", f.typ, val)
		}
		g.p("return e")
		g.p("}")
	}
	g.p("")

	// Decoder.
	if len(m.fields) == 0 {
		g.p("func (%s) decodeArgs(d decoder) decoder { return d }", recv)
	} else {
		g.p("func (%s) decodeArgs(d decoder) decoder {", mv)
		for i, f := range m.fields {
			if f.typ == "bit" {
				gi := groupOf(start, i)
				if start[i] {
					// Only name the octet if some bit of the group is exposed.
					if groupUsed(m.fields, start, i) {
						g.p("bits%d := d.octet()", gi)
					} else {
						g.p("d.octet()")
					}
				}
				if f.goName != "" {
					g.p("m.%s = bits%d&(1<<%d) != 0", f.goName, gi, pos[i])
				}
				continue
			}
			if f.goName == "" {
				g.p("d.skip%s()", goName(f.typ))
				continue
			}
			g.p("m.%s = d.%s()", f.goName, f.typ)
		}
		g.p("return d")
		g.p("}")
	}
	g.p("")
}

func groupOf(start []bool, i int) int {
	for !start[i] {
		i--
	}
	return i
}

func groupUsed(fs []field, start []bool, first int) bool {
	for i := first; i < len(fs) && fs[i].typ == "bit" && (i == first || !start[i]); i++ {
		if fs[i].goName != "" {
			return true
		}
	}
	return false
}

func zeroValue(typ string) string {
	switch typ {
	case "shortstr", "longstr":
		return `""`
	case "table":
		return "nil"
	case "timestamp":
		return "time.Time{}"
	default:
		return "0"
	}
}
