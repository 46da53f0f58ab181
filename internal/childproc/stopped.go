package childproc

import (
	"fmt"
	"os"
	"strings"
)

// Stopped reports whether every thread of process pid is stopped (state T
// in /proc/<pid>/task/*/stat): a SIGSTOP has taken effect. It reports false
// where /proc cannot tell.
func Stopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		i := strings.LastIndexByte(string(b), ')')
		if err != nil || i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}
