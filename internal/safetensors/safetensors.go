// Package safetensors parses the header of a safetensors file and generates
// synthetic models whose every byte can be checked without a copy of the
// source: tensor data is a pure function of a seed and the absolute file
// offset (see Fill).
//
// Format: an 8-byte little-endian length N, N bytes of JSON header (padded
// with spaces), then the data region. Each tensor's data_offsets are relative
// to the start of the data region, byte 8+N.
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// MaxHeader is the largest header the format allows (100 MB).
const MaxHeader = 100 << 20

// Tensor is one entry of the header.
type Tensor struct {
	Name  string
	DType string
	Shape []int64
	// Begin and End are absolute file offsets of the tensor's bytes.
	Begin, End int64
}

// Header is a parsed safetensors header.
type Header struct {
	// DataStart is the absolute offset of the data region (8 + N).
	DataStart int64
	// Tensors in key order: the order safe_open's keys() yields and loaders
	// copy them in.
	Tensors  []Tensor
	Metadata map[string]string
}

// HeaderLen decodes the first 8 bytes of a file: the JSON header's length.
// It rejects lengths the format does not allow or that the file cannot hold.
func HeaderLen(prefix []byte, fileSize int64) (int64, error) {
	if len(prefix) < 8 || fileSize < 8 {
		return 0, errors.New("safetensors: file shorter than the 8-byte header length")
	}
	n := binary.LittleEndian.Uint64(prefix)
	if n > MaxHeader {
		return 0, fmt.Errorf("safetensors: header length %d exceeds the %d-byte limit", n, MaxHeader)
	}
	if int64(n) > fileSize-8 {
		return 0, fmt.Errorf("safetensors: header length %d runs past the end of a %d-byte file", n, fileSize)
	}
	return int64(n), nil
}

type rawTensor struct {
	DType       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// Parse decodes the JSON header json (the N bytes after the length) of a
// file of fileSize bytes and checks every tensor lies inside the file.
func Parse(header []byte, fileSize int64) (*Header, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(header, &raw); err != nil {
		return nil, fmt.Errorf("safetensors: header is not a JSON object: %w", err)
	}
	if raw == nil {
		return nil, errors.New("safetensors: header is not a JSON object")
	}
	h := &Header{DataStart: 8 + int64(len(header))}
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &h.Metadata); err != nil {
				return nil, fmt.Errorf("safetensors: __metadata__: %w", err)
			}
			continue
		}
		var rt rawTensor
		if err := json.Unmarshal(msg, &rt); err != nil {
			return nil, fmt.Errorf("safetensors: tensor %q: %w", name, err)
		}
		b, e := rt.DataOffsets[0], rt.DataOffsets[1]
		if b < 0 || e < b || e > fileSize-h.DataStart { // written so that it cannot overflow
			return nil, fmt.Errorf("safetensors: tensor %q: data_offsets [%d, %d] outside the %d-byte data region",
				name, b, e, fileSize-h.DataStart)
		}
		h.Tensors = append(h.Tensors, Tensor{Name: name, DType: rt.DType, Shape: rt.Shape,
			Begin: h.DataStart + b, End: h.DataStart + e})
	}
	sort.Slice(h.Tensors, func(i, j int) bool { return h.Tensors[i].Name < h.Tensors[j].Name })
	return h, nil
}

// DTypeSize is the byte size of one element of dtype, 0 if unknown.
func DTypeSize(dtype string) int64 {
	switch dtype {
	case "F64", "I64", "U64":
		return 8
	case "F32", "I32", "U32":
		return 4
	case "F16", "BF16", "I16", "U16":
		return 2
	case "F8_E4M3", "F8_E5M2", "I8", "U8", "BOOL":
		return 1
	}
	return 0
}

// NaturalLess orders names the way loaders order shard files: runs of
// digits compare by value, so "model-2-of-10" sorts before "model-10-of-10".
func NaturalLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := digitRun(a), digitRun(b)
		if da > 0 && db > 0 {
			na := strings.TrimLeft(a[:da], "0")
			nb := strings.TrimLeft(b[:db], "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			if da != db {
				return da < db
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func digitRun(s string) int {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}
