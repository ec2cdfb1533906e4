/* Connecting to a Unix stream socket by path: the one place a client builds a sockaddr_un. */
#ifndef COVE_UNIX_SOCK_H
#define COVE_UNIX_SOCK_H

/*
 * A connected SOCK_STREAM socket to `path` (close-on-exec, plus `flags` such as SOCK_NONBLOCK),
 * or -errno: -ENAMETOOLONG when the path does not fit sun_path. timeout_s > 0 sets both
 * SO_RCVTIMEO and SO_SNDTIMEO before connecting (the send timeout also bounds connect).
 */
int unix_connect(const char *path, int flags, double timeout_s);

#endif
