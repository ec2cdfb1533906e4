# Shared by bench/boot, bench/disk and bench/io (sourced): build cove, find the cached guest
# kernel and rootfs, the --add list that puts QEMU microvm into the KVM box, and the
# one-box-per-round loop.

# Sets kdir and rdir.
bench_prepare() {
	[ -f build/build.ninja ] || meson setup build >&2
	ninja -C build >&2
	kdir=$(guest/kernel/build | tail -n 1)
	rdir=$(guest/rootfs/build | tail -n 1)
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
