package dist

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultTimeout is how long ExchangeID waits for the other ranks when
// not told otherwise (torchrun's store waits as long).
const DefaultTimeout = 5 * time.Minute

// MaxIDBytes bounds the id a rendezvous carries (kernels.MaxCommIDBytes).
const MaxIDBytes = 4096

// The wire format, all integers big-endian uint32:
//
//	rank -> rank 0: magic "SPILLRDV", version, rank, world size
//	rank 0 -> rank: magic "SPILLRDV", status (0 ok, 1 error), length, bytes
//
// where the bytes are the id, or on error a message. Rank 0 answers once
// every rank has joined, so ExchangeID is also a barrier.
const (
	magic   = "SPILLRDV"
	version = 1
)

// ExchangeID hands the communicator id from rank 0 to every rank over TCP
// and returns it: rank 0 passes the id and listens on cfg.Addr() until
// every other rank has connected; the others pass nil and dial it,
// retrying while rank 0 is not up yet. It fails, on every rank that can be
// told, when a rank reports another WORLD_SIZE or a rank joins twice; it
// gives up after timeout (0: DefaultTimeout) or when ctx is done. Errors
// name this rank and the address.
func ExchangeID(ctx context.Context, cfg Config, id []byte, timeout time.Duration) ([]byte, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if cfg.Rank == 0 {
		if len(id) == 0 || len(id) > MaxIDBytes {
			return nil, fmt.Errorf("dist: rank 0: an id of %d bytes (want 1 to %d)", len(id), MaxIDBytes)
		}
		if cfg.WorldSize == 1 {
			return id, nil
		}
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", cfg.Addr())
		if err != nil {
			return nil, fmt.Errorf("dist: rank 0: rendezvous: listening on %s (MASTER_ADDR:MASTER_PORT): %w", cfg.Addr(), err)
		}
		defer ln.Close()
		if err := serve(ctx, ln, cfg, id, timeout); err != nil {
			return nil, err
		}
		return id, nil
	}
	if id != nil {
		return nil, fmt.Errorf("dist: rank %d: only rank 0 brings the id", cfg.Rank)
	}
	return join(ctx, cfg, timeout)
}

// serve is rank 0's side: accept the other ranks, check their hellos and,
// once all are there, send each the id.
func serve(ctx context.Context, ln net.Listener, cfg Config, id []byte, timeout time.Duration) (err error) {
	type hello struct {
		conn net.Conn
		rank int
		err  error // a bad hello: the rendezvous fails
	}
	hellos := make(chan hello)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// failure is why the rendezvous failed, for the ranks whose hellos
	// were read but not yet taken when it did: they are told too.
	var failure atomic.Pointer[string]
	// Run in reverse: stop accepting, note the failure, unblock the
	// readers, wait for them.
	defer wg.Wait()
	defer close(stop)
	defer func() {
		if err != nil {
			msg := err.Error()
			failure.Store(&msg)
		}
	}()
	defer ln.Close()
	go func() {
		select {
		case <-ctx.Done():
			ln.Close() // ends Accept
		case <-stop:
		}
	}()
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				// The watcher ends a hello still being read when the
				// rendezvous stops; it is done (cut says whether it cut the
				// read) before anything else sets conn's deadline, so that
				// it cannot cut the failure's answer below too.
				read, watched := make(chan struct{}), make(chan struct{})
				var cut bool
				go func() {
					defer close(watched)
					select {
					case <-stop:
						cut = true
						conn.SetDeadline(time.Now())
					case <-read:
					}
				}()
				h := hello{conn: conn}
				h.rank, h.err = readHello(ctx, conn, cfg.WorldSize)
				close(read)
				<-watched
				select {
				case hellos <- h:
				case <-stop:
					// A rank whose hello was read, or cut short by the stop,
					// is told why (a stray connection told too does no harm).
					if m := failure.Load(); m != nil && (h.err == nil || cut) {
						conn.SetDeadline(time.Now().Add(time.Second))
						_ = writeReply(context.Background(), conn, 1, []byte(*m))
					}
					conn.Close()
				}
			})
		}
	})

	conns := make([]net.Conn, cfg.WorldSize)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	// fail tells every connected rank why the rendezvous failed.
	fail := func(err error) error {
		for _, c := range conns {
			if c != nil {
				_ = writeReply(ctx, c, 1, []byte(err.Error()))
			}
		}
		return err
	}
	for joined := 1; joined < cfg.WorldSize; {
		select {
		case h := <-hellos:
			if h.err != nil {
				addr := h.conn.RemoteAddr()
				_ = writeReply(ctx, h.conn, 1, []byte(h.err.Error()))
				h.conn.Close()
				if errors.Is(h.err, errNotARank) {
					continue // a stray connection, not one of ours
				}
				return fail(fmt.Errorf("dist: rank 0: rendezvous on %s: %s: %w", cfg.Addr(), addr, h.err))
			}
			if conns[h.rank] != nil {
				err := fmt.Errorf("dist: rank 0: rendezvous on %s: rank %d joined twice (from %s and %s): check RANK",
					cfg.Addr(), h.rank, conns[h.rank].RemoteAddr(), h.conn.RemoteAddr())
				conns = append(conns, h.conn) // told too
				return fail(err)
			}
			conns[h.rank] = h.conn
			joined++
		case <-ctx.Done():
			var missing []string
			for r := 1; r < cfg.WorldSize; r++ {
				if conns[r] == nil {
					missing = append(missing, fmt.Sprint(r))
				}
			}
			why := ctx.Err()
			if errors.Is(why, context.DeadlineExceeded) {
				why = fmt.Errorf("timed out after %v", timeout)
			}
			return fail(fmt.Errorf("dist: rank 0: rendezvous on %s: %w waiting for rank %s of %d",
				cfg.Addr(), why, strings.Join(missing, ", "), cfg.WorldSize))
		}
	}
	for r, c := range conns {
		if c == nil {
			continue
		}
		if err := writeReply(ctx, c, 0, id); err != nil {
			return fail(fmt.Errorf("dist: rank 0: rendezvous on %s: sending the id to rank %d: %w", cfg.Addr(), r, err))
		}
	}
	return nil
}

var errNotARank = errors.New("not a spill rendezvous hello")

// readHello reads and checks a rank's hello.
func readHello(ctx context.Context, conn net.Conn, worldSize int) (int, error) {
	setDeadline(ctx, conn)
	var b [len(magic) + 12]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		return 0, fmt.Errorf("%w: %v", errNotARank, err)
	}
	if string(b[:len(magic)]) != magic {
		return 0, errNotARank
	}
	be := binary.BigEndian
	v, rank, size := be.Uint32(b[8:]), int(be.Uint32(b[12:])), int(be.Uint32(b[16:]))
	switch {
	case v != version:
		return 0, fmt.Errorf("a rank speaks rendezvous version %d, rank 0 version %d: run the same spill everywhere", v, version)
	case size != worldSize:
		return 0, fmt.Errorf("rank %d has WORLD_SIZE=%d, rank 0 has %d", rank, size, worldSize)
	case rank <= 0 || rank >= worldSize:
		return 0, fmt.Errorf("a rank has RANK=%d, out of range 1..%d", rank, worldSize-1)
	}
	return rank, nil
}

// join is the side of a rank other than 0.
func join(ctx context.Context, cfg Config, timeout time.Duration) ([]byte, error) {
	where := fmt.Sprintf("dist: rank %d: rendezvous with rank 0 at %s", cfg.Rank, cfg.Addr())
	var d net.Dialer
	var conn net.Conn
	var lastErr error
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		var err error
		if conn, err = d.DialContext(ctx, "tcp", cfg.Addr()); err == nil {
			break
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: %w (is rank 0 running, and MASTER_ADDR:MASTER_PORT its address? last error: %v)",
				where, timeoutErr(ctx, timeout), lastErr)
		case <-time.After(wait):
		}
	}
	defer conn.Close()
	setDeadline(ctx, conn)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	var b [len(magic) + 12]byte
	copy(b[:], magic)
	be := binary.BigEndian
	be.PutUint32(b[8:], version)
	be.PutUint32(b[12:], uint32(cfg.Rank))
	be.PutUint32(b[16:], uint32(cfg.WorldSize))
	if _, err := conn.Write(b[:]); err != nil {
		return nil, fmt.Errorf("%s: sending hello: %w", where, err)
	}
	status, payload, err := readReply(conn)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w waiting for the other ranks", where, timeoutErr(ctx, timeout))
		}
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if status != 0 {
		return nil, fmt.Errorf("%s: rank 0 refused: %s", where, payload)
	}
	return payload, nil
}

func timeoutErr(ctx context.Context, timeout time.Duration) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("timed out after %v", timeout)
	}
	return ctx.Err()
}

func setDeadline(ctx context.Context, conn net.Conn) {
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
}

func writeReply(ctx context.Context, conn net.Conn, status uint32, payload []byte) error {
	setDeadline(ctx, conn)
	b := make([]byte, len(magic)+8, len(magic)+8+len(payload))
	copy(b, magic)
	binary.BigEndian.PutUint32(b[8:], status)
	binary.BigEndian.PutUint32(b[12:], uint32(len(payload)))
	_, err := conn.Write(append(b, payload...))
	return err
}

func readReply(conn net.Conn) (uint32, []byte, error) {
	var b [len(magic) + 8]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, nil, errors.New("rank 0 closed the connection without an answer")
		}
		return 0, nil, err
	}
	if string(b[:len(magic)]) != magic {
		return 0, nil, fmt.Errorf("%s is not a spill rendezvous (bad answer %q)", conn.RemoteAddr(), b[:len(magic)])
	}
	status, n := binary.BigEndian.Uint32(b[8:]), binary.BigEndian.Uint32(b[12:])
	if n > MaxIDBytes && status == 0 || n > 1<<20 {
		return 0, nil, fmt.Errorf("answer of %d bytes is too long", n)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(conn, payload); err != nil {
		return 0, nil, fmt.Errorf("reading the answer: %w", err)
	}
	return status, slices.Clip(payload), nil
}
