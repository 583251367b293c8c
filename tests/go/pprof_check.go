// Reads a gzipped pprof protobuf profile with the `profile` package of github.com/google/pprof
// (Debian's golang-github-google-pprof-dev), checks it with CheckValid, and prints what the
// HTTP endpoint's tests assert on, one fact per line:
//
//	valid
//	time_nanos N
//	duration_nanos N
//	period N
//	mapping FILE build_id=ID functions=BOOL filenames=BOOL lines=BOOL
//	locations N named N with_lines N without_mapping N unnamed_with_mapping N
//	function NAME FILE:LINE        (each distinct function and the first line seen for it)
//
// Run in GOPATH mode (offline): GO111MODULE=off GOPATH=/usr/share/gocode go run pprof_check.go FILE
package main

import (
	"fmt"
	"os"

	"github.com/google/pprof/profile"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: pprof_check PROFILE.pb.gz")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	p, err := profile.Parse(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "parse:", err)
		os.Exit(1)
	}
	if err := p.CheckValid(); err != nil {
		fmt.Fprintln(os.Stderr, "invalid:", err)
		os.Exit(1)
	}
	fmt.Println("valid")
	fmt.Println("time_nanos", p.TimeNanos)
	fmt.Println("duration_nanos", p.DurationNanos)
	fmt.Println("period", p.Period)
	for _, m := range p.Mapping {
		fmt.Printf("mapping %s build_id=%s functions=%v filenames=%v lines=%v\n",
			m.File, m.BuildID, m.HasFunctions, m.HasFilenames, m.HasLineNumbers)
	}
	named, withLines, withoutMapping, unnamedWithMapping := 0, 0, 0, 0
	firstLine := map[string]string{}
	var order []string
	for _, l := range p.Location {
		if l.Mapping == nil {
			withoutMapping++
		}
		if len(l.Line) == 0 {
			if l.Mapping != nil && l.Address != 0 {
				unnamedWithMapping++
			}
			continue
		}
		named++
		hasLine := false
		for _, line := range l.Line {
			if line.Line != 0 {
				hasLine = true
			}
			if _, seen := firstLine[line.Function.Name]; !seen {
				order = append(order, line.Function.Name)
				firstLine[line.Function.Name] = fmt.Sprintf("%s:%d", line.Function.Filename, line.Line)
			}
		}
		if hasLine {
			withLines++
		}
	}
	fmt.Printf("locations %d named %d with_lines %d without_mapping %d unnamed_with_mapping %d\n",
		len(p.Location), named, withLines, withoutMapping, unnamedWithMapping)
	for _, name := range order {
		fmt.Println("function", name, firstLine[name])
	}
}
