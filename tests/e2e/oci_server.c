/*
 * The distroless image's one program (tests/e2e/make-oci-images builds it static): as the
 * image's Entrypoint, `oci-server PORT` answers every HTTP request on 0.0.0.0:PORT with
 * "oci-server uid=U cwd=D\n"; `oci-server --whoami` prints the uid, gid, working directory
 * and the OCI_GREETING environment variable, so cove exec's defaults can be checked in an
 * image without a shell.
 */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	char cwd[512];
	if (!getcwd(cwd, sizeof(cwd)))
		strcpy(cwd, "?");
	if (argc == 2 && !strcmp(argv[1], "--whoami")) {
		const char *g = getenv("OCI_GREETING");
		printf("uid=%u gid=%u cwd=%s greeting=%s\n", (unsigned)getuid(), (unsigned)getgid(),
		       cwd, g ? g : "");
		return 0;
	}
	if (argc != 2)
		return 2;
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(s, 16) < 0) {
		perror("oci-server");
		return 1;
	}
	for (;;) {
		int c = accept(s, NULL, NULL);
		if (c < 0)
			continue;
		char req[2048], body[600], resp[800];
		ssize_t n = read(c, req, sizeof(req));
		(void)n;
		int bl = snprintf(body, sizeof(body), "oci-server uid=%u cwd=%s\n",
				  (unsigned)getuid(), cwd);
		int rl =
		    snprintf(resp, sizeof(resp),
			     "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			     bl, body);
		if (write(c, resp, (size_t)rl) < 0)
			perror("oci-server: write");
		close(c);
	}
}
