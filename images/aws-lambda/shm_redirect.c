/*
 * LD_PRELOAD shim: POSIX shared memory without /dev/shm.
 *
 * Triton's Python backend exchanges tensors with its stub processes through shm_open()
 * regions. AWS Lambda mounts no /dev/shm, so every Python-backend model fails to load there
 * ("Unable to initialize shared memory key ..."). When /dev/shm is not writable, this shim
 * backs the same regions with files in $SPILLWAY_SHM_DIR (default /tmp/spillway-shm), which
 * processes map MAP_SHARED exactly as they would map /dev/shm. When /dev/shm is writable it
 * calls the real functions, so the image behaves the same everywhere else.
 *
 * Set SPILLWAY_SHM_DIR_FORCE=1 to redirect even when /dev/shm is usable (for tests).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int use_real_shm(void) {
    static int cached = -1;
    if (cached < 0) {
        const char *force = getenv("SPILLWAY_SHM_DIR_FORCE");
        cached = !(force && strcmp(force, "1") == 0) && access("/dev/shm", W_OK) == 0;
    }
    return cached;
}

static int redirected_path(const char *name, char *out, size_t size) {
    const char *dir = getenv("SPILLWAY_SHM_DIR");
    if (!dir || !*dir) dir = "/tmp/spillway-shm";
    while (*name == '/') name++;
    if (!*name || strchr(name, '/')) {
        errno = EINVAL;
        return -1;
    }
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) return -1;
    if ((size_t)snprintf(out, size, "%s/%s", dir, name) >= size) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return 0;
}

int shm_open(const char *name, int oflag, mode_t mode) {
    if (use_real_shm()) {
        int (*real)(const char *, int, mode_t) = (int (*)(const char *, int, mode_t))dlsym(RTLD_NEXT, "shm_open");
        if (real) return real(name, oflag, mode);
    }
    char path[PATH_MAX];
    if (redirected_path(name, path, sizeof path) < 0) return -1;
    return open(path, oflag | O_CLOEXEC | O_NOFOLLOW, mode);
}

int shm_unlink(const char *name) {
    if (use_real_shm()) {
        int (*real)(const char *) = (int (*)(const char *))dlsym(RTLD_NEXT, "shm_unlink");
        if (real) return real(name);
    }
    char path[PATH_MAX];
    if (redirected_path(name, path, sizeof path) < 0) return -1;
    return unlink(path);
}
