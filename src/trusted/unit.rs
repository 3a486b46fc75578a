//! The systemd unit a process runs in, from its cgroup path, read the way
//! systemd reads it (`cg_path_get_unit`, `cg_path_get_user_unit`): slices
//! are passed over, the first other component that is a unit name is the
//! unit; below a user manager (`user@UID.service`) the first unit after its
//! slices is the user's unit.

/// The suffixes of systemd unit names.
const UNIT_SUFFIXES: [&str; 11] = [
    ".service",
    ".scope",
    ".socket",
    ".mount",
    ".swap",
    ".device",
    ".target",
    ".timer",
    ".path",
    ".slice",
    ".automount",
];

/// The longest unit name systemd allows.
const UNIT_NAME_MAX: usize = 255;

/// `(unit, user_unit)` of a process whose `/proc/PID/cgroup` is `cgroup`:
/// the path of systemd's own hierarchy (`name=systemd`, on legacy and
/// hybrid hosts) if there is one, else the unified one (`0::`).
pub fn units(cgroup: &str) -> (Option<String>, Option<String>) {
    let mut unified = None;
    let mut named = None;
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers == "name=systemd" {
            named = Some(path);
        } else if controllers.is_empty() && line.starts_with("0:") {
            unified = Some(path);
        }
    }
    match named.or(unified) {
        Some(path) => units_of_path(path),
        None => (None, None),
    }
}

/// `(unit, user_unit)` of a cgroup path such as
/// `/system.slice/nginx.service` or
/// `/user.slice/user-1000.slice/user@1000.service/app.slice/foo.service`.
pub fn units_of_path(path: &str) -> (Option<String>, Option<String>) {
    let mut components = path.split('/').filter(|c| !c.is_empty()).map(unescape);
    let Some(unit) = first_unit(&mut components) else {
        return (None, None);
    };
    let user_unit = if is_user_manager(&unit) {
        first_unit(&mut components)
    } else {
        None
    };
    (Some(unit), user_unit)
}

/// The first component that is not a slice, if it is a unit name.
fn first_unit<'a>(components: &mut impl Iterator<Item = &'a str>) -> Option<String> {
    let c = components.find(|c| !c.ends_with(".slice"))?;
    is_unit_name(c).then(|| c.to_string())
}

/// systemd escapes a cgroup name that could clash with the kernel's own
/// files with a leading `_`.
fn unescape(component: &str) -> &str {
    component.strip_prefix('_').unwrap_or(component)
}

fn is_unit_name(name: &str) -> bool {
    name.len() <= UNIT_NAME_MAX
        && UNIT_SUFFIXES
            .iter()
            .any(|s| name.len() > s.len() && name.ends_with(s))
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":-_.\\@".contains(&b))
}

/// `user@UID.service`: a user's service manager.
fn is_user_manager(unit: &str) -> bool {
    unit.strip_prefix("user@")
        .and_then(|rest| rest.strip_suffix(".service"))
        .is_some_and(|uid| !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(path: &str) -> (Option<String>, Option<String>) {
        units_of_path(path)
    }

    fn s(name: &str) -> Option<String> {
        Some(name.to_string())
    }

    #[test]
    fn units_are_found_as_systemd_finds_them() {
        assert_eq!(
            of("/system.slice/nginx.service"),
            (s("nginx.service"), None)
        );
        assert_eq!(
            of("/system.slice/system-getty.slice/getty@tty1.service"),
            (s("getty@tty1.service"), None)
        );
        assert_eq!(
            of("/user.slice/user-1000.slice/session-2.scope"),
            (s("session-2.scope"), None)
        );
        assert_eq!(
            of("/user.slice/user-1000.slice/user@1000.service/app.slice/foo.service"),
            (s("user@1000.service"), s("foo.service"))
        );
        assert_eq!(
            of("/user.slice/user-1000.slice/user@1000.service/init.scope"),
            (s("user@1000.service"), s("init.scope"))
        );
        assert_eq!(
            of("/system.slice/docker-abc.scope/inner"),
            (s("docker-abc.scope"), None)
        );
        assert_eq!(of("/system.slice/_cpu.service"), (s("cpu.service"), None));
        assert_eq!(of("/init.scope"), (s("init.scope"), None));
        assert_eq!(of("/"), (None, None));
        assert_eq!(of("/system.slice"), (None, None));
        assert_eq!(of("/process_api/e8cf4051"), (None, None));
    }

    #[test]
    fn the_systemd_hierarchy_is_preferred_to_the_unified_one() {
        let hybrid = "12:memory:/x\n9:name=systemd:/system.slice/a.service\n\
                      0::/system.slice/b.service\n";
        assert_eq!(units(hybrid).0.as_deref(), Some("a.service"));
        let unified = "0::/system.slice/b.service\n";
        assert_eq!(units(unified).0.as_deref(), Some("b.service"));
        assert_eq!(units("garbage"), (None, None));
        assert_eq!(units(""), (None, None));
    }
}
