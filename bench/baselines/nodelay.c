#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static void nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int socket(int domain, int type, int protocol) {
    static int (*real)(int, int, int);
    if (!real) real = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
    int fd = real(domain, type, protocol);
    if (fd >= 0 && (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM) nodelay(fd);
    return fd;
}

int accept(int s, struct sockaddr *a, socklen_t *l) {
    static int (*real)(int, struct sockaddr *, socklen_t *);
    if (!real) real = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
    int fd = real(s, a, l);
    if (fd >= 0) nodelay(fd);
    return fd;
}

int accept4(int s, struct sockaddr *a, socklen_t *l, int f) {
    static int (*real)(int, struct sockaddr *, socklen_t *, int);
    if (!real) real = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
    int fd = real(s, a, l, f);
    if (fd >= 0) nodelay(fd);
    return fd;
}
