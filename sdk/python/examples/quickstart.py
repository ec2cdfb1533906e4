"""The SDK in ten lines (README): a sandbox, a command, a file, a stop and a reconnect."""
from cove import Sandbox

sbx = Sandbox.create("agent-demo")
print(sbx.exec("echo hello from $(hostname)").text.strip())
sbx.files.write("/notes.txt", "kept across the stop")
sbx.stop()                                   # RAM freed; the next call restores it
again = Sandbox.connect("agent-demo")
print("notes:", again.files.read("/notes.txt").decode())
print("exit code:", again.exec(["sh", "-c", "exit 3"]).exit_code)
again.rm()
