package offload

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
)

// parseMemAvailable returns MemAvailable in bytes from the text of /proc/meminfo.
func parseMemAvailable(data []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 || string(f[0]) != "MemAvailable:" {
			continue
		}
		kb, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil || (len(f) > 2 && string(f[2]) != "kB") {
			return -1, fmt.Errorf("/proc/meminfo:%d: cannot parse %q", line, sc.Text())
		}
		return kb << 10, nil
	}
	return -1, fmt.Errorf("/proc/meminfo: no MemAvailable line")
}
