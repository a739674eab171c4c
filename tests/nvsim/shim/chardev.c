/*
 * The one thing `keling-nvsim sandbox` fakes outside the driver's ABI.
 *
 * NVIDIA's libcuda and libnvidia-ml check with stat(2) that /dev/nvidiactl and
 * /dev/nvidiaN are character devices 195:255 and 195:N before they open them.
 * FUSE can only serve regular files (and this kernel has no CUSE), so this
 * preload library rewrites the answer of the four stat entry points those
 * libraries import (__xstat, __xstat64, __fxstat, __fxstatat: nm -D shows
 * nothing else) for exactly the simulator's device files, recognised by the
 * (st_dev, st_ino) of the FUSE inode the bind mounts keep. Everything else,
 * and every other call (open, ioctl, mmap, close), goes to the kernel as is,
 * where Keling's probes see it. Programs that call stat/statx directly (Rust's
 * std, Keling itself) are not affected.
 *
 * KELING_NVSIM_CHARDEVS="DEV:INO=MAJ:MIN,..." (DEV as the kernel's dev_t in
 * decimal) says which inodes to present as which character devices.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#define MAX_FAKES 256

struct fake {
	unsigned long long dev, ino;
	unsigned int major, minor;
};

static struct fake fakes[MAX_FAKES];
static int nfakes = -1;

static void load(void)
{
	const char *s = getenv("KELING_NVSIM_CHARDEVS");
	nfakes = 0;
	while (s && *s && nfakes < MAX_FAKES) {
		char *end;
		struct fake f;
		f.dev = strtoull(s, &end, 10);
		if (*end != ':')
			return;
		f.ino = strtoull(end + 1, &end, 10);
		if (*end != '=')
			return;
		f.major = (unsigned int)strtoul(end + 1, &end, 10);
		if (*end != ':')
			return;
		f.minor = (unsigned int)strtoul(end + 1, &end, 10);
		fakes[nfakes++] = f;
		if (*end != ',')
			return;
		s = end + 1;
	}
}

static void fix(unsigned long long dev, unsigned long long ino, mode_t *mode, dev_t *rdev)
{
	if (nfakes < 0)
		load();
	for (int i = 0; i < nfakes; i++) {
		if (fakes[i].dev == dev && fakes[i].ino == ino) {
			*mode = S_IFCHR | (*mode & 07777);
			*rdev = makedev(fakes[i].major, fakes[i].minor);
			return;
		}
	}
}

int __xstat(int ver, const char *path, struct stat *st)
{
	(void)ver;
	int r = stat(path, st);
	if (r == 0)
		fix(st->st_dev, st->st_ino, &st->st_mode, &st->st_rdev);
	return r;
}

int __xstat64(int ver, const char *path, struct stat64 *st)
{
	(void)ver;
	int r = stat64(path, st);
	if (r == 0)
		fix(st->st_dev, st->st_ino, &st->st_mode, &st->st_rdev);
	return r;
}

int __fxstat(int ver, int fd, struct stat *st)
{
	(void)ver;
	int r = fstat(fd, st);
	if (r == 0)
		fix(st->st_dev, st->st_ino, &st->st_mode, &st->st_rdev);
	return r;
}

int __fxstatat(int ver, int dirfd, const char *path, struct stat *st, int flags)
{
	(void)ver;
	int r = fstatat(dirfd, path, st, flags);
	if (r == 0)
		fix(st->st_dev, st->st_ino, &st->st_mode, &st->st_rdev);
	return r;
}
