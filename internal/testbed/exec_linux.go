//go:build linux

package testbed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// execArg0 is the argv[0] of a process that Exec re-executed: it marks the
// process for execInNetns, which runs before main (and before TestMain).
// Its argv is execArg0, the namespace's path, the program's path and then
// the program's own argv.
const execArg0 = "testbed-netns-exec"

// sysfsArg0 is the argv[0] of a process that SetDevAttr started: it marks
// the process for writeSysfs. Its argv is sysfsArg0, the file and the
// value.
const sysfsArg0 = "testbed-sysfs-write"

func init() {
	switch {
	case len(os.Args) >= 4 && os.Args[0] == execArg0:
		execInNetns(os.Args[1], os.Args[2], os.Args[3:])
	case len(os.Args) == 3 && os.Args[0] == sysfsArg0:
		writeSysfs(os.Args[1], os.Args[2])
	}
}

// writeSysfs is the child of SetDevAttr, started inside the namespace with
// a private mount namespace: it mounts a sysfs of its network namespace
// over /sys, writes value to path in it and exits, with status 0 if the
// write succeeded.
func writeSysfs(path, value string) {
	err := unix.Mount("sysfs", "/sys", "sysfs", 0, "")
	if err != nil {
		err = fmt.Errorf("mount sysfs: %w", err)
	} else {
		err = os.WriteFile(path, []byte(value+"\n"), 0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// execInNetns is the re-executed child of Exec: it switches its thread
// into the namespace at nsPath and replaces the process with prog (argv),
// keeping its pid, environment, descriptors and directory. execve(2) ends
// every other thread of the process; the program runs with the namespaces
// of the thread that called it. It does not return: on error it exits with
// status 127, as a shell does for a command it cannot run.
func execInNetns(nsPath, prog string, argv []string) {
	runtime.LockOSThread()
	err := func() error {
		fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open netns %s: %w", nsPath, err)
		}
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("setns %s: %w", nsPath, err)
		}
		unix.Close(fd)
		return unix.Exec(prog, argv, os.Environ())
	}()
	fmt.Fprintf(os.Stderr, "testbed: run %s in a network namespace: %v\n", prog, err)
	os.Exit(127)
}

// Exec returns a command that runs name with args inside the namespace.
// ctx bounds its life as in exec.CommandContext; the caller starts and
// waits for it, and may set its Stdin, Stdout, Stderr, Env, Dir,
// ExtraFiles and SysProcAttr as for any command.
//
// The returned command re-executes this binary (/proc/self/exe) with a
// marked argv: testbed's init, before main, sees the mark, switches its
// thread into the namespace (setns(2) on the path Path returns) and
// execve(2)s the program, which so keeps the pid that the command started:
// ctx's kill, Process.Signal and Wait reach the program itself. A command
// that the caller starts cannot simply be forked from a thread inside the
// namespace (as Do allows for one testbed starts itself): exec.Cmd.Start
// forks from whatever thread the caller's goroutine is on. name is looked
// up in PATH here, as exec.Command does; a missing program makes Start
// fail with exec.ErrNotFound. The program sees the process's file system
// as it is: unlike `ip netns exec`, no /etc/netns/NAME files are bound
// over /etc and /sys is not remounted (it shows the process's devices;
// see SetDevAttr). The namespace must stay open until the program has
// started.
func (n *Netns) Exec(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	if cmd.Err != nil {
		return cmd
	}
	prog := cmd.Path
	cmd.Path = "/proc/self/exe"
	cmd.Args = append([]string{execArg0, n.Path(), prog}, cmd.Args...)
	return cmd
}
