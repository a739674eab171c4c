//! The scheduler around its pure core (`keling-sched`): the daemon that joins the
//! trace to the core ([`daemon`]), with launches ([`launch`]), which process is
//! whose ([`members`]) and what clients hear ([`notify`]) beside it, and the
//! machine they act on behind one trait ([`host`]); the actuators that carry out
//! its decisions ([`actuator`], [`cgroup`], [`boost`]) on a thread of their own
//! ([`worker`]), who may ask for what ([`access`]), the logs ([`log`]), the rules
//! file ([`config`]) and the fail-safe that outlives and watches the agent
//! ([`supervisor`]).
pub mod access;
pub mod actuator;
pub mod boost;
pub mod cgroup;
pub mod config;
pub mod daemon;
pub mod history;
pub mod host;
pub mod launch;
pub mod log_writer;
pub mod members;
pub mod notify;
pub mod records;
pub mod sharing;
pub mod supervisor;
pub mod worker;

/// Longest task name kept, in bytes (a name is for people reading a status
/// line or a notice).
const NAME_MAX: usize = 64;

/// A task's name as Keling shows it, from text its owner chose (the launched
/// command's basename, an adopted process's `comm`): control characters and
/// the invisible ones that reorder or hide text are `?`, and it is cut to
/// [`NAME_MAX`] bytes. Names reach other users' terminals (`keling status`,
/// the notices of a freeze or an eviction): an escape sequence in one would
/// be theirs to run.
pub fn task_name(raw: &str) -> String {
    let invisible = |c: char| matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    let mut name = String::with_capacity(raw.len().min(NAME_MAX));
    for c in raw.chars() {
        let c = if c.is_control() || invisible(c) {
            '?'
        } else {
            c
        };
        if name.len() + c.len_utf8() > NAME_MAX {
            break;
        }
        name.push(c);
    }
    name
}

#[cfg(test)]
mod tests {
    use super::task_name;

    #[test]
    fn task_names_carry_no_control_or_invisible_characters_and_stay_short() {
        assert_eq!(task_name("python3"), "python3");
        assert_eq!(task_name("\u{1b}]0;owned\u{7}x"), "?]0;owned?x");
        assert_eq!(task_name("a\nb\rc\td"), "a?b?c?d");
        assert_eq!(task_name("evil\u{202e}txt.exe"), "evil?txt.exe");
        assert_eq!(task_name("名前"), "名前");
        let long = "é".repeat(100);
        let cut = task_name(&long);
        assert_eq!(cut.len(), 64);
        assert!(cut.chars().all(|c| c == 'é'));
        assert_eq!(task_name(&"x".repeat(300)).len(), 64);
    }
}
