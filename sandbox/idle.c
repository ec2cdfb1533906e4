/* Idle stop: activity sampling on a timer, the agent asked off the loop, snapshot and stop. */
#include "sandbox/idle.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "devices/virtio_vsock.h"
#include "sandbox/agent_client.h"
#include "sandbox/sandbox.h"
#include "vmm/evloop.h"

/* CPU time the vCPU threads used so far. */
static uint64_t guest_cpu_ns(struct sandbox *sb)
{
	uint64_t sum = 0;

	for (int i = 0; i < sb->vm.nr_vcpus; i++) {
		clockid_t cid;
		struct timespec ts;

		if (!sb->vm.vcpus[i].thread_started ||
		    pthread_getcpuclockid(sb->vm.vcpus[i].thread, &cid) || clock_gettime(cid, &ts))
			continue;
		sum += (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
	}
	return sum;
}

/* vsock bytes both ways, and whether any connection is open. */
static uint64_t vsock_bytes(struct sandbox *sb, bool *open)
{
	struct virtio_vsock *v = board_nth(&sb->board, &virtio_vsock_type, 0);

	*open = v && v->nr_conns > 0;
	return v ? v->rx_bytes + v->tx_bytes : 0;
}

/* On its own thread: does the agent run any command (attached or detached)? */
static void *ask_agent(void *arg)
{
	struct sandbox *sb = arg;
	struct idle_watch *w = &sb->idle;
	pthread_setname_np(pthread_self(), "cove-idle");
	json_t *req = json_pack("{s:s}", "op", "status"), *reply = NULL, *s;
	char err[200];
	bool busy = false;
	size_t i;
	int fd = agent_call(sb->mc.vsock_uds, 2.0, req, &reply, err, sizeof(err));

	if (fd >= 0) {
		close(fd);
		json_array_foreach(json_object_get(reply, "sessions"), i, s) busy =
		    busy || json_is_true(json_object_get(s, "running"));
	} else {
		busy = true; /* an agent that does not answer is not proof of idleness */
	}
	json_decref(req);
	json_decref(reply);
	__atomic_store_n(&w->asked_busy, busy, __ATOMIC_RELEASE);
	__atomic_store_n(&w->answered, true, __ATOMIC_RELEASE);
	return NULL;
}

/* A new quiet window starts now (cpu: the vCPU threads' CPU time so far). */
static void quiet_restart(struct idle_watch *w, uint64_t now, uint64_t cpu)
{
	w->quiet_since_ns = now;
	w->quiet_cpu_ns = cpu;
}

static void stop_idle(struct sandbox *sb)
{
	struct idle_watch *w = &sb->idle;
	char err[256], cause[64];

	if (sandbox_snapshot_now(sb, err, sizeof(err))) {
		log_warn(&sb->log,
			 "idle for %llu s but the snapshot failed, so it keeps running: %s",
			 (unsigned long long)(w->limit_ms / 1000), err);
		quiet_restart(w, mono_ns(), guest_cpu_ns(sb));
		return;
	}
	snprintf(cause, sizeof(cause), "idle %llus", (unsigned long long)(w->limit_ms / 1000));
	/* A new empty file beside the layer just written: a claim the host checks, not a record. */
	if (sb->snap_ready) {
		int fd = openat(sb->snap.dfd, SBX_IDLE_NOTE,
				O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd < 0 && errno != EEXIST)
			log_warn(&sb->log, "idle stop: cannot leave %s in the chain: %s",
				 SBX_IDLE_NOTE, strerror(errno));
		if (fd >= 0)
			close(fd);
	}
	log_info(&sb->log, "%s: snapshot taken, stopping", cause);
	vm_request_stop(&sb->vm, 0, "stopped after %s", cause);
}

static void on_tick(void *opaque, uint32_t events)
{
	struct sandbox *sb = opaque;
	struct idle_watch *w = &sb->idle;
	uint64_t ticks, now = mono_ns(), cpu, bytes, api, used;
	bool open, vsock_busy, other_busy;

	(void)events;
	if (read(w->timer_fd, &ticks, sizeof(ticks)) < 0)
		return;
	cpu = guest_cpu_ns(sb);
	bytes = vsock_bytes(sb, &open);
	api = __atomic_load_n(&w->api_calls, __ATOMIC_ACQUIRE);
	vsock_busy = open || bytes != w->last_vsock_bytes;
	/* Paused is a state someone chose: not idle. */
	other_busy = api != w->last_api || vm_get_state(&sb->vm) != VM_RUNNING;
	w->last_vsock_bytes = bytes;
	w->last_api = api;
	if (w->asking) {
		/* Our own question is vsock traffic, and the guest's CPU time while its agent
		 * answers is the answer's: only the other signals count meanwhile. */
		w->busy_while_asking |= other_busy;
		if (!__atomic_load_n(&w->answered, __ATOMIC_ACQUIRE))
			return;
		pthread_join(w->asker, NULL);
		w->asking = false;
		if (w->asked_busy || w->busy_while_asking) {
			log_info(&sb->log, "idle: not idle: %s",
				 w->busy_while_asking ? "an API call or a state change while asking"
						      : "the guest agent runs a command or did not "
							"answer");
			quiet_restart(w, now, cpu);
		} else {
			stop_idle(sb);
		}
		return;
	}
	if (vsock_busy || other_busy) {
		quiet_restart(w, now, cpu);
		return;
	}
	if (now - w->quiet_since_ns < w->limit_ms * 1000000ULL)
		return;
	/*
	 * Quiet long enough. Guest CPU time counts averaged over the whole window: an idle
	 * kernel's periodic work (writeback, RCU, timers) comes in bursts that one short tick
	 * would take for activity, the more so on a loaded host; a guest that computes stays
	 * above the threshold over any window. (Another thread's CPU clock was seen to step back
	 * a little in the KVM box: no wrap to "busy".)
	 */
	used = cpu > w->quiet_cpu_ns ? cpu - w->quiet_cpu_ns : 0;
	if (used * 1000 > (uint64_t)IDLE_CPU_PERMILLE * (now - w->quiet_since_ns)) {
		log_info(&sb->log, "idle: not idle: guest CPU %.1f%% over the last %.1f s",
			 100.0 * (double)used / (double)(now - w->quiet_since_ns),
			 (double)(now - w->quiet_since_ns) / 1e9);
		quiet_restart(w, now, cpu);
		return;
	}
	/* Then ask the agent about running commands before stopping. */
	w->answered = w->busy_while_asking = false;
	w->asking = pthread_create(&w->asker, NULL, ask_agent, sb) == 0;
	if (!w->asking)
		quiet_restart(w, now, cpu);
}

void idle_note_api(struct idle_watch *w)
{
	__atomic_fetch_add(&w->api_calls, 1, __ATOMIC_RELEASE);
}

int idle_start(struct sandbox *sb, struct evloop *loop)
{
	struct idle_watch *w = &sb->idle;
	uint64_t tick_ms = w->limit_ms < 40000 ? w->limit_ms / 4 : 10000;
	struct itimerspec its = {0};
	bool open;

	w->timer_fd = -1;
	if (!w->limit_ms)
		return 0;
	if (!sb->snap_ready || !sb->mc.vsock_uds[0]) {
		log_err(&sb->log,
			"--idle-stop needs --snapshot-dir and vsock (to snapshot, and to ask "
			"the guest agent about running commands)");
		return -EINVAL;
	}
	tick_ms = tick_ms < 250 ? 250 : tick_ms;
	its.it_value.tv_sec = its.it_interval.tv_sec = (time_t)(tick_ms / 1000);
	its.it_value.tv_nsec = its.it_interval.tv_nsec = (long)(tick_ms % 1000) * 1000000;
	w->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (w->timer_fd < 0 || timerfd_settime(w->timer_fd, 0, &its, NULL) < 0 ||
	    evloop_add(loop, w->timer_fd, EPOLLIN, on_tick, sb)) {
		log_err(&sb->log, "cannot set up the idle timer");
		return -EIO;
	}
	quiet_restart(w, mono_ns(), guest_cpu_ns(sb));
	w->last_vsock_bytes = vsock_bytes(sb, &open);
	return 0;
}

void idle_stop_watch(struct sandbox *sb)
{
	struct idle_watch *w = &sb->idle;

	if (w->asking) {
		pthread_join(w->asker, NULL);
		w->asking = false;
	}
	if (w->timer_fd >= 0)
		close(w->timer_fd);
	w->timer_fd = -1;
}
