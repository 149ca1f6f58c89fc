// fy-sockfilter's Go oracle: what podman's Go code makes of bytes, told by
// Go's own libraries (Debian's golang-go and golang-github-json-iterator-go-dev,
// built offline: GO111MODULE=off GOPATH=/usr/share/gocode go build).
//
//	sockfilter-oracle serve   answers framed questions on stdin/stdout (below)
//	sockfilter-oracle table   prints src/go_case_table.h, measured from the decoders
//
// serve: each question is one byte of kind, a 4-byte big-endian length, then
// that many bytes; each answer is a 4-byte big-endian length, then JSON.
//
//	'L' a libpod create body, 'C' a compat create body: decoded as each podman
//	    decodes it (4.3.1 and 5.8.2: encoding/json; 6.0-dev: json-iterator's
//	    ConfigCompatibleWithStandardLibrary, utils.ReadJSONFromBody), into a
//	    struct with that version's real field set (fields/*.txt: every JSON name
//	    of SpecGenerator, or of CreateContainerConfig and its HostConfig, as the
//	    source has them). Answer: {"views":[{"engine","decoder","error",
//	    "runtime","annotations"}]}, where runtime is the runtime field as bound
//	    (libpod oci_runtime, compat HostConfig.Runtime; null when no key bound
//	    it or it was null), annotations the map as bound (merged), and
//	    hostconfig whether a key bound compat's HostConfig.
//	'H' the bytes a proxy wrote to the engine: read with net/http.ReadRequest,
//	    request after request, each body read to its end as the server does.
//	    Answer: {"requests":[{method,target_hex,proto,host,header,
//	    content_length,transfer_encoding,body_hex,trailer,close,body_error}],
//	    "error","rest_hex"}: error is what ended the reading (empty at a clean
//	    end), rest the bytes left; bytes in hex, as they need not be UTF-8.
//
// The non-protected fields are json.RawMessage: the oracle accepts any value
// there, so it never reports less binding than podman (which may also refuse
// a body for a wrong type elsewhere; a refused create creates nothing).
package main

import (
	"bufio"
	"bytes"
	"embed"
	"encoding/binary"
	"encoding/hex"
	stdjson "encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"sort"
	"strings"
	"unicode"

	jsoniter "github.com/json-iterator/go"
)

//go:embed fields/*.txt
var fieldFiles embed.FS

var podmanJsoniter = jsoniter.ConfigCompatibleWithStandardLibrary

func names(file string) []string {
	b, err := fieldFiles.ReadFile("fields/" + file)
	if err != nil {
		panic(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

var (
	rawType    = reflect.TypeOf(stdjson.RawMessage{})
	strPtrType = reflect.TypeOf((*string)(nil))
	mapType    = reflect.TypeOf(map[string]string{})
)

// structOf builds a struct type with one field per JSON name: `special` names
// get their given type, the others json.RawMessage.
func structOf(jsonNames []string, special map[string]reflect.Type) reflect.Type {
	var fs []reflect.StructField
	for i, n := range jsonNames {
		t, ok := special[n]
		if !ok {
			t = rawType
		}
		fs = append(fs, reflect.StructField{
			Name: fmt.Sprintf("F%d", i),
			Type: t,
			Tag:  reflect.StructTag(fmt.Sprintf(`json:%q`, n+",omitempty")),
		})
	}
	return reflect.StructOf(fs)
}

type engine struct {
	name    string // "podman 4.3.1"
	decoder string // "encoding/json" or "json-iterator 1.1.12"
	libpod  reflect.Type
	compat  reflect.Type
}

var engines []engine

func setup() {
	for _, v := range []struct{ ver, dec string }{
		{"4.3.1", "encoding/json"}, {"5.8.2", "encoding/json"}, {"6.0-dev", "json-iterator"},
	} {
		hc := structOf(names("hostconfig-"+v.ver+".txt"),
			map[string]reflect.Type{"Runtime": strPtrType, "Annotations": mapType})
		e := engine{
			name:    "podman " + v.ver,
			decoder: v.dec,
			libpod: structOf(names("libpod-"+v.ver+".txt"),
				map[string]reflect.Type{"oci_runtime": strPtrType, "annotations": mapType}),
			compat: structOf(names("compat-"+v.ver+".txt"),
				map[string]reflect.Type{"HostConfig": reflect.PtrTo(hc)}),
		}
		engines = append(engines, e)
	}
}

type view struct {
	Engine      string            `json:"engine"`
	Decoder     string            `json:"decoder"`
	Error       *string           `json:"error"`
	Runtime     *string           `json:"runtime"`
	Annotations map[string]string `json:"annotations"`
	HostConfig  bool              `json:"hostconfig"` // compat: a key bound HostConfig (not null)
}

func field(v reflect.Value, jsonName string) reflect.Value {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		if strings.Split(t.Field(i).Tag.Get("json"), ",")[0] == jsonName {
			return v.Field(i)
		}
	}
	return reflect.Value{} // podman 4.3's HostConfig has no Annotations
}

// decode reads body as podman's create handler of that version does: one
// value from a stream decoder (trailing data is never read), nothing at all
// for an empty body (6.0's ReadJSONFromBody; older ones fail on EOF).
func decode(e engine, libpod bool, body []byte) view {
	t := e.compat
	if libpod {
		t = e.libpod
	}
	ptr := reflect.New(t)
	var err error
	if e.decoder == "encoding/json" {
		err = stdjson.NewDecoder(bytes.NewReader(body)).Decode(ptr.Interface())
	} else if len(body) > 0 {
		err = podmanJsoniter.NewDecoder(bytes.NewReader(body)).Decode(ptr.Interface())
	}
	out := view{Engine: e.name, Decoder: e.decoder}
	if err != nil {
		s := err.Error()
		out.Error = &s
	}
	v := ptr.Elem()
	var rt, ann reflect.Value
	if libpod {
		rt, ann = field(v, "oci_runtime"), field(v, "annotations")
	} else if hc := field(v, "HostConfig"); !hc.IsNil() {
		out.HostConfig = true
		rt, ann = field(hc.Elem(), "Runtime"), field(hc.Elem(), "Annotations")
	}
	if rt.IsValid() && !rt.IsNil() {
		s := rt.Elem().String()
		out.Runtime = &s
	}
	if ann.IsValid() && !ann.IsNil() {
		out.Annotations = ann.Interface().(map[string]string)
	}
	return out
}

type request struct {
	Method           string              `json:"method"`
	Target           string              `json:"target_hex"`
	Proto            string              `json:"proto"`
	Host             string              `json:"host"`
	Header           map[string][]string `json:"header"`
	ContentLength    int64               `json:"content_length"`
	TransferEncoding []string            `json:"transfer_encoding"`
	Body             string              `json:"body_hex"`
	Trailer          map[string][]string `json:"trailer"`
	Close            bool                `json:"close"`
	BodyError        string              `json:"body_error"`
}

// readStream reads requests as net/http's server does: ReadRequest, then the
// body to its end (which reads a chunked body's trailer section into
// req.Trailer), then the next request from the same buffered reader.
func readStream(data []byte) map[string]interface{} {
	br := bufio.NewReader(bytes.NewReader(data))
	var reqs []request
	ending := ""
	for {
		if _, err := br.Peek(1); err == io.EOF {
			break
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			ending = err.Error()
			break
		}
		body, berr := io.ReadAll(req.Body)
		r := request{
			Method: req.Method, Target: hex.EncodeToString([]byte(req.RequestURI)), Proto: req.Proto, Host: req.Host,
			Header: req.Header, ContentLength: req.ContentLength,
			TransferEncoding: req.TransferEncoding, Body: hex.EncodeToString(body),
			Trailer: req.Trailer, Close: req.Close,
		}
		if berr != nil {
			r.BodyError = berr.Error()
		}
		reqs = append(reqs, r)
		if berr != nil {
			ending = "body: " + berr.Error()
			break
		}
	}
	rest, _ := io.ReadAll(br)
	if reqs == nil {
		reqs = []request{}
	}
	return map[string]interface{}{"requests": reqs, "error": ending, "rest_hex": hex.EncodeToString(rest)}
}

func serve() error {
	in := bufio.NewReader(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(in, hdr[:]); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		payload := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(in, payload); err != nil {
			return err
		}
		var answer interface{}
		switch hdr[0] {
		case 'L', 'C':
			var views []view
			for _, e := range engines {
				views = append(views, decode(e, hdr[0] == 'L', payload))
			}
			answer = map[string]interface{}{"views": views}
		case 'H':
			answer = readStream(payload)
		default:
			return fmt.Errorf("unknown question kind %q", hdr[0])
		}
		js, err := stdjson.Marshal(answer)
		if err != nil {
			return err
		}
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(js)))
		out.Write(n[:])
		out.Write(js)
		if err := out.Flush(); err != nil {
			return err
		}
	}
}

// probeBinding returns, for each code point, the ASCII letter whose field a
// one-rune key binds to under the decoder, measured by decoding into a struct
// of 26 one-letter fields (more than 10, so json-iterator takes the same
// general path as podman's structs; encoding/json folds a name rune by rune,
// so a letter binds alike alone or inside a longer name).
func probeBinding(decoder string) map[rune]byte {
	var letters []string
	for c := 'a'; c <= 'z'; c++ {
		letters = append(letters, string(c))
	}
	special := map[string]reflect.Type{}
	for _, l := range letters {
		special[l] = reflect.TypeOf((*int)(nil))
	}
	t := structOf(letters, special)
	found := map[rune]byte{}
	for c := rune(0x80); c <= unicode.MaxRune; c++ {
		if c >= 0xD800 && c <= 0xDFFF {
			continue
		}
		key, _ := stdjson.Marshal(string(c))
		body := []byte("{" + string(key) + ":1}")
		ptr := reflect.New(t)
		var err error
		if decoder == "encoding/json" {
			err = stdjson.Unmarshal(body, ptr.Interface())
		} else {
			err = podmanJsoniter.Unmarshal(body, ptr.Interface())
		}
		if err != nil {
			panic(fmt.Sprintf("%s: %U: %v", decoder, c, err))
		}
		for i := 0; i < t.NumField(); i++ {
			if !ptr.Elem().Field(i).IsNil() {
				found[c] = byte('a' + i)
			}
		}
	}
	return found
}

// fromTables is the same mapping read from Go's unicode tables directly:
// json-iterator's strings.ToLower (unicode.ToLower per rune), encoding/json's
// simple folding (the SimpleFold orbit). table refuses to print when the
// decoders and the tables disagree.
func fromTables(decoder string) map[rune]byte {
	found := map[rune]byte{}
	for c := rune(0x80); c <= unicode.MaxRune; c++ {
		if decoder == "json-iterator" {
			if l := unicode.ToLower(c); l >= 'a' && l <= 'z' {
				found[c] = byte(l)
			}
			continue
		}
		for f := unicode.SimpleFold(c); f != c; f = unicode.SimpleFold(f) {
			if f >= 'a' && f <= 'z' {
				found[c] = byte(f)
			}
		}
	}
	return found
}

func table() error {
	var b strings.Builder
	b.WriteString("// Generated by `sockfilter-oracle table` (lifecycle/sockfilter/tests/oracle) from\n" +
		"// Debian's Go encoding/json and json-iterator 1.1.12: do not edit. The test go_case_table\n" +
		"// regenerates it and fails when it differs.\n//\n" +
		"// Every non-ASCII code point that a decoder binds to a struct field as an ASCII\n" +
		"// letter, measured by decoding each code point (U+0080..U+10FFFF) as a key and\n" +
		"// checked against Go's unicode tables:\n" +
		"//   kJsoniterLower: json-iterator's strings.ToLower match (unicode.ToLower);\n" +
		"//   kEncodingJsonFold: encoding/json's simple folding (also strings.EqualFold,\n" +
		"//   and so gorilla/schema's query keys).\n" +
		"#pragma once\n\nnamespace fy::sockfilter {\n\nstruct GoCaseFold {\n  char32_t rune;\n  char ascii;\n};\n")
	for _, d := range []struct{ name, decoder string }{
		{"kJsoniterLower", "json-iterator"}, {"kEncodingJsonFold", "encoding/json"},
	} {
		measured, tables := probeBinding(d.decoder), fromTables(d.decoder)
		if !reflect.DeepEqual(measured, tables) {
			return fmt.Errorf("%s binds %v but Go's tables say %v", d.decoder, measured, tables)
		}
		var cps []int
		for c := range measured {
			cps = append(cps, int(c))
		}
		sort.Ints(cps)
		fmt.Fprintf(&b, "\ninline constexpr GoCaseFold %s[] = {\n", d.name)
		for _, c := range cps {
			fmt.Fprintf(&b, "    {0x%04X, '%c'},  // %U %q\n", c, measured[rune(c)], c, rune(c))
		}
		b.WriteString("};\n")
	}
	b.WriteString("\n}  // namespace fy::sockfilter\n")
	_, err := os.Stdout.WriteString(b.String())
	return err
}

func main() {
	setup()
	var err error
	switch {
	case len(os.Args) == 2 && os.Args[1] == "serve":
		err = serve()
	case len(os.Args) == 2 && os.Args[1] == "table":
		err = table()
	default:
		err = errors.New("usage: sockfilter-oracle serve | table")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sockfilter-oracle:", err)
		os.Exit(1)
	}
}
