/* A container on a terminal (cli/oci.h): the engine's console socket gets the pty's master. */
#include "cli/oci.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/errmsg.h"

int oci_console(struct oci_ctx *x, const char *socket_path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int m = -1, s = -1, slave = -1, ret;
	char *name;

	if (!socket_path)
		return errmsg(x->err, sizeof(x->err), -EINVAL,
			      "process.terminal is set and no --console-socket was given");
	if (strlen(socket_path) >= sizeof(sa.sun_path))
		return errmsg(x->err, sizeof(x->err), -ENAMETOOLONG, "--console-socket: too long");
	strcpy(sa.sun_path, socket_path);
	m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (m < 0 || grantpt(m) < 0 || unlockpt(m) < 0 || !(name = ptsname(m))) {
		ret = errmsg(x->err, sizeof(x->err), -errno, "pty: %s", strerror(errno));
		goto out;
	}
	slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
	s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (slave < 0 || s < 0 || connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		ret = errmsg(x->err, sizeof(x->err), -errno, "--console-socket %s: %s", socket_path,
			     strerror(errno));
		goto out;
	}
	/* As runc does: the pty's name as the message, the master as SCM_RIGHTS. */
	char cbuf[CMSG_SPACE(sizeof(int))] = {0};
	struct iovec iov = {.iov_base = name, .iov_len = strlen(name)};
	struct msghdr msg = {
	    .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &m, sizeof(int));
	if (sendmsg(s, &msg, 0) < 0) {
		ret = errmsg(x->err, sizeof(x->err), -errno, "--console-socket: send: %s",
			     strerror(errno));
		goto out;
	}
	ret = slave;
	slave = -1;
out:
	if (slave >= 0)
		close(slave);
	if (s >= 0)
		close(s);
	if (m >= 0)
		close(m);
	return ret;
}

void oci_console_take(int tty)
{
	if (tty < 0)
		return;
	setsid();
	ioctl(tty, TIOCSCTTY, 0);
	dup2(tty, 0);
	dup2(tty, 1);
	dup2(tty, 2);
	close(tty);
}
