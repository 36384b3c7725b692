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
    import ast, linecache, os, traceback
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
    # Source lines for tracebacks of the model's code.
    linecache.cache['<python>'] = (len(src), None, src.splitlines(True), '<python>')
    try:
        tree = ast.parse(src, filename='<python>', mode='exec')
    except (SyntaxError, ValueError) as e:
        traceback.print_exception(type(e), e, None)
        return 1
    final = None
    if last_mode != 'none' and tree.body and isinstance(tree.body[-1], ast.Expr):
        node = tree.body[-1].value
        is_print = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'print'
        if not (last_mode == 'print' and is_print):
            final = ast.Expression(body=tree.body.pop().value)
            ast.fix_missing_locations(final)
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
        traceback.print_exception(type(e), e, tb)
        return 1
    return 0

_mark = []
_code = _arpo_main(_mark)
# What a normal interpreter exit does that the code can see: wait for its
# non-daemon threads, run its atexit handlers, flush the output.
try:
    import threading
    threading._shutdown()
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
if len(_token) == 32 and all(c in b'0123456789abcdef' for c in _token):
    try:
        _os.write(2, b'\x00\x01ARPO' + _token + b'000')
        _os.write(1, b'\x00\x01ARPO' + _token + b'%03d' % _code)
    except BaseException:
        pass
# Then leave without the interpreter's own teardown (module and object
# finalisation, ~4 ms; the process and its memory go with it anyway).
_os._exit(_code)
`;
