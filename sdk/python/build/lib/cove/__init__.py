"""cove: drive cove sandboxes from Python (standard library only, Python 3.11).

    from cove import Sandbox
    sbx = Sandbox.create("agent1")
    print(sbx.exec("uname -r").text)
    sbx.files.write("/notes.txt", "hello")
    sbx.stop()                                  # RAM freed; the next call reconnects it
    print(Sandbox.connect("agent1").files.read("/notes.txt"))

Life-cycle calls run the `cove` command line ($COVE, else `cove` on PATH, with
COVE_STATE_DIR and COVE_RUN_DIR as cove reads them); commands and files speak the guest
agent's protocol over the sandbox's vsock socket. Errors are typed (cove.errors) and carry
cove's exit status. AsyncSandbox is the asyncio twin.
"""
from .aio import AsyncSandbox
from .errors import (AlreadyExists, BadPolicy, CoveError, Deleted, HeldElsewhere, Incompatible,
                     InvalidName, KeyRefused, NotFound, StartFailed, Timeout)
from .sandbox import ExecResult, Files, Sandbox

__version__ = "0.1.0"  # cove's version (meson.build); tests/docs checks that they agree

__all__ = ["AlreadyExists", "AsyncSandbox", "BadPolicy", "CoveError", "Deleted", "ExecResult",
           "Files", "HeldElsewhere", "Incompatible", "InvalidName", "KeyRefused", "NotFound",
           "Sandbox", "StartFailed", "Timeout", "__version__"]
