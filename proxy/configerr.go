package proxy

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// ConfigError is a start-up failure that a configuration value caused: a listen address
// that cannot be bound (no such host, port in use, no permission) or a data directory that
// cannot be created or written. The command line reports it in one line with the config
// key, and exits as for any other bad configuration value.
type ConfigError struct {
	Key   string // the config key, e.g. "gcp.listen"
	Value string
	Err   error
}

func (e *ConfigError) Error() string { return fmt.Sprintf("%s: %q: %v", e.Key, e.Value, e.Err) }
func (e *ConfigError) Unwrap() error { return e.Err }

// Listen binds addr for the listener configured by key; a failure is a *ConfigError.
func Listen(key, addr string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Err != nil {
			err = oe.Err // "listen tcp 1.2.3.4:5: " adds nothing to the key and value
		}
		return nil, &ConfigError{Key: key, Value: addr, Err: err}
	}
	return lis, nil
}

// checkDataDir makes sure dir exists (creating it) and can be written; a failure is a
// *ConfigError for embedded.data_dir.
func checkDataDir(dir string) error {
	fail := func(err error) error { return &ConfigError{Key: "embedded.data_dir", Value: dir, Err: err} }
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(err)
	}
	f, err := os.CreateTemp(dir, ".write-check-*")
	if err != nil {
		return fail(err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(filepath.Clean(name))
}
