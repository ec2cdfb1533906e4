# Shared by the benches that run in the KVM box (sourced): build cove, find the cached guest
# kernel and rootfs, the --add list that puts QEMU microvm into the KVM box, the
# one-box-per-round loop, and the quick mode.

# Quick mode (`bench/NAME --quick`, as the first argument; tools/test runs every bench so): no
# build step (a missing binary fails instead of being rebuilt), and kvm_box checks the inputs of
# the box run (tools/kvm-box --check: every file it would add, their libraries, that the in-box
# .py scripts compile) and ends the bench there, with status 0 or 1. Nothing boots: seconds.
bench_quick=0
if [ "${1:-}" = --quick ]; then
	bench_quick=1
	shift
fi

# Sets kdir and rdir.
bench_prepare() {
	if [ "$bench_quick" = 0 ]; then
		[ -f build/build.ninja ] || meson setup build >&2
		ninja -C build >&2
	fi
	kdir=$(guest/kernel/build | tail -n 1)
	rdir=$(guest/rootfs/build | tail -n 1)
}

# tools/kvm-box with the same arguments, or in quick mode its --check (then the bench ends).
kvm_box() {
	if [ "$bench_quick" = 1 ]; then
		if tools/kvm-box --check "$@" >&2; then
			echo '{"quick": "inputs checked (tools/kvm-box --check), nothing booted"}'
			exit 0
		fi
		echo "bench: quick check failed: an input of the box run is missing or broken" >&2
		exit 1
	fi
	tools/kvm-box "$@"
}

# QEMU and the firmware microvm loads (it resolves bios-microvm.bin to qboot.rom), plus the
# in-box helper module with QEMU's base command line and the shared test library (vsock
# CONNECT handshake), both beside the *_in_box.py scripts. Paths hold no spaces: use unquoted.
QEMU_BOX_ADDS="--add /usr/bin/qemu-system-x86_64:/work/qemu/qemu-system-x86_64
	--add /usr/share/qemu/qboot.rom:/work/qemu/share/bios-microvm.bin
	--add /usr/share/qemu/qboot.rom:/work/qemu/share/qboot.rom
	--add /usr/share/qemu/linuxboot_dma.bin:/work/qemu/share/linuxboot_dma.bin
	--add /usr/share/qemu/pvh.bin:/work/qemu/share/pvh.bin
	--add /usr/share/qemu/kvmvapic.bin:/work/qemu/share/kvmvapic.bin
	--add bench/box_vmm.py:/work/box_vmm.py
	--add tests/lib/covetest.py:/work/covetest.py"

# bench_rounds NAME RUNS: calls `one_round DIR` (defined by the caller) until RUNS rounds
# succeeded or 2*RUNS were tried. The box (nested SVM under QEMU TCG) now and then goes idle
# for good, seen with both cove and QEMU as the inner VMM; a fresh box per round with a short
# timeout keeps such stalls from eating the bench. Sets `rounds` to the number tried.
bench_rounds() {
	rounds=0
	_ok=0
	while [ "$_ok" -lt "$2" ] && [ "$rounds" -lt $((2 * $2)) ]; do
		mkdir -p "$out/$rounds"
		if one_round "$out/$rounds"; then
			_ok=$((_ok + 1))
		else
			echo "bench/$1: round $rounds failed (box stalled?)" >&2
		fi
		rounds=$((rounds + 1))
	done
}
