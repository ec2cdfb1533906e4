/* One thread per accepted connection: `cove forward`, cove-init's agent and its broker proxy. */
#ifndef COVE_ACCEPT_SERVE_H
#define COVE_ACCEPT_SERVE_H

/* Serves one accepted connection; owns fd (closes it). Runs on its own detached thread. */
typedef void (*accept_serve_fn)(void *ctx, int fd);

/*
 * Accepts connections on lfd forever, each served by serve(ctx, fd) on a new detached thread
 * (ctx must outlive every connection). A connection that cannot get memory or a thread is
 * closed; a failing accept is retried after a short pause. Never returns.
 */
void accept_serve(int lfd, accept_serve_fn serve, void *ctx) __attribute__((noreturn));

#endif
