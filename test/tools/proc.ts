// Reads of /proc for the tools tests. A process may exit between listing
// /proc and reading its files: every read here treats that as "gone".
import * as fs from 'fs';

/** A /proc file's text, or null once the process is gone. */
export function procFile(pid: number | string, name: string): string | null {
  try {
    return fs.readFileSync(`/proc/${pid}/${name}`, 'utf8');
  } catch {
    return null;
  }
}

/** The process exists and is not a zombie. */
export function alive(pid: number): boolean {
  const status = procFile(pid, 'status');
  return status !== null && !/^State:\s+Z/m.test(status);
}

/** The pids in /proc now. */
export function pids(): number[] {
  return fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p)).map(Number);
}

/** The fields of /proc/<pid>/stat after the command name (0: state, 2: process group, 16: nice), or null once gone. */
export function stat(pid: number): string[] | null {
  const text = procFile(pid, 'stat');
  return text === null ? null : text.slice(text.lastIndexOf(')') + 2).split(' ');
}

/** Live processes of process group `pgid`. */
export function groupOf(pgid: number): number[] {
  return pids().filter((p) => alive(p) && Number(stat(p)?.[2]) === pgid);
}

/** The real uid of a process, or null once it is gone. */
export function uidOf(pid: number): number | null {
  const m = /^Uid:\s+(\d+)/m.exec(procFile(pid, 'status') ?? '');
  return m ? Number(m[1]) : null;
}

/** Its command line with spaces between the arguments, or null once it is gone. */
export function cmdline(pid: number): string | null {
  return procFile(pid, 'cmdline')?.replace(/\0/g, ' ') ?? null;
}

/** Live processes whose real uid is `uid`. */
export function ofUid(uid: number): number[] {
  return pids().filter((p) => alive(p) && uidOf(p) === uid);
}
