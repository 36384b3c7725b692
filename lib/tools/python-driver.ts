// The Python program that runs inside the sandbox: says it is ready (one ACK
// byte, 0x06, on stdout), reads the model's code from stdin and runs it like a
// REPL cell (the last expression's value is printed).
// Kept as a string so it ships inside the compiled package (tsc copies no .py).

/**
 * argv flags: `--last=repr|print|none` (what to do with a final expression),
 * `--block-net` (the fallback network guard when no network namespace exists).
 *
 * `repr`: like the Python REPL, print repr(value) unless it is None.
 * `print`: the ARPO reference's PythonTool._preprocess_code: wrap the final
 * expression in print() unless it already is a print call (so None prints).
 */
export const PYTHON_DRIVER = String.raw`
import sys

def _arpo_main(mark):
    # Only builtin modules before the code runs: every import here is paid by
    # each sandbox (ast, linecache and traceback cost ~17 ms of CPU at start on
    # a slow VM). The tree comes from compile()'s AST flag and the builtin
    # _ast classes; tracebacks import what they need when there is one.
    import _ast, os
    flags = sys.argv[1:]
    last_mode = 'repr'
    for f in flags:
        if f.startswith('--last='):
            last_mode = f[len('--last='):]
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors='backslashreplace')
        except Exception:
            pass
    # Ready: one ACK byte on stdout (the host strips it) says the interpreter
    # is up and waiting for its code, so a warm pool knows its start is done.
    sys.stdout.buffer.write(b'\x06')
    sys.stdout.buffer.flush()
    data = sys.stdin.buffer.read()
    # The host's first line: this call's token for the end marks written below.
    nl = data.find(b'\n')
    mark.append(data[:nl] if nl >= 0 else b'')
    src = data[nl + 1:].decode('utf-8', 'replace')
    sys.stdin = open(os.devnull)
    sys.argv = ['<python>']
    if '--block-net' in flags:
        import socket, _socket
        def _no_network(*args, **kwargs):
            raise PermissionError(1, 'network access is disabled in this sandbox')
        class _BlockedSocket(socket.socket):
            def __init__(self, *args, **kwargs):
                _no_network()
        socket.socket = _BlockedSocket
        socket.create_connection = _no_network
        socket.socketpair = _no_network
        socket.fromfd = _no_network
        _socket.socket = _BlockedSocket
    try:
        tree = compile(src, '<python>', 'exec', _ast.PyCF_ONLY_AST)
    except (SyntaxError, ValueError) as e:
        _print_exception(src, e, None)
        return 1
    final = None
    if last_mode != 'none' and tree.body and isinstance(tree.body[-1], _ast.Expr):
        node = tree.body[-1].value
        is_print = isinstance(node, _ast.Call) and isinstance(node.func, _ast.Name) and node.func.id == 'print'
        if not (last_mode == 'print' and is_print):
            # An Expression node has no position of its own; its body keeps the source's.
            final = _ast.Expression(body=tree.body.pop().value)
    scope = {'__name__': '__main__', '__builtins__': __builtins__}
    try:
        exec(compile(tree, '<python>', 'exec'), scope)
        if final is not None:
            value = eval(compile(final, '<python>', 'eval'), scope)
            if last_mode == 'print':
                print(value)
            elif value is not None:
                print(repr(value))
    except SystemExit as e:
        code = e.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except BaseException as e:
        tb = e.__traceback__
        # Drop this driver's own frame so the traceback starts in the model's code.
        while tb is not None and tb.tb_frame.f_code.co_filename != '<python>':
            tb = tb.tb_next
        _print_exception(src, e, tb)
        return 1
    return 0

def _print_exception(src, e, tb):
    # Source lines for tracebacks of the model's code.
    import linecache, traceback
    linecache.cache['<python>'] = (len(src), None, src.splitlines(True), '<python>')
    traceback.print_exception(type(e), e, tb)

_mark = []
_code = _arpo_main(_mark)
# What a normal interpreter exit does that the code can see: wait for its
# non-daemon threads, run its atexit handlers, flush the output.
# (Only when the code imported threading: the import alone costs ~5 ms.)
try:
    if 'threading' in sys.modules:
        sys.modules['threading']._shutdown()
except BaseException:
    pass
try:
    import atexit
    atexit._run_exitfuncs()
except BaseException:
    pass
try:
    sys.stdout.flush()
    sys.stderr.flush()
except BaseException:
    _code = 1
_code = _code & 0xff if isinstance(_code, int) else 1
import os as _os
# End marks: the output is complete. The host returns the call on them and
# kills the sandbox, instead of waiting for this process and its namespaces to
# be torn down (tens of ms when several calls end together).
_token = _mark[0] if _mark else b''
_marked = False
if len(_token) == 32 and all(c in b'0123456789abcdef' for c in _token):
    try:
        _os.write(2, b'\x00\x01ARPO' + _token + b'000')
        _os.write(1, b'\x00\x01ARPO' + _token + b'%03d' % _code)
        _marked = True
    except BaseException:
        pass
# Then wait, with no thread of the code left running, until the host kills
# this sandbox or closes its end of the stdout socket (or is gone): the
# teardown of this process and its namespaces (~4 ms of CPU here) comes when
# no call is running, not in the middle of a burst of them. Where fd 1 is no
# socket (read fails at once) or a thread of the code still runs, exit now.
# Signals stay blocked while it waits: no handler of the code runs again.
if _marked and len(sys._current_frames()) == 1:
    try:
        import _signal
        _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
        _os.read(1, 1)
    except BaseException:
        pass
# Leave without the interpreter's own teardown (module and object
# finalisation, ~4 ms; the process and its memory go with it anyway).
_os._exit(_code)
`;
