# install.cmake: what `cmake --install` (and `make install`) puts where.
#
# Included at the end of the root CMakeLists.txt. Installs, under the prefix
# given at install time (`cmake --install BUILD --prefix P`, DESTDIR honoured):
#
#   sbin/wcached, bin/wcachectl                    component Runtime
#   LIBDIR/libwcache.so.0.x.y, libwcache.so.0      component Library
#   include/wcache.h, LIBDIR/libwcache.so,          component Development
#   LIBDIR/pkgconfig/wcache.pc,
#   LIBDIR/cmake/wcache/ (find_package(wcache):
#   imported target wcache::wcache)
#   lib/systemd/system/ (every .service and .socket of systemd/, with the
#   ExecStart=/ExecReload= paths of wcached and wcachectl rewritten to where
#   they are installed), lib/sysusers.d/, lib/tmpfiles.d/  component Runtime
#   share/man/man{1,3,5,8}/                         Runtime and Development
#   share/doc/wcache/ (README.md, wcached.conf.example)  component Runtime
#   /etc/wcached.conf (the example, only if absent) component Runtime
#   WCACHE_PYTHON_DIR/wcache/, wcache-V.dist-info/,  component Python
#   wcache-safetensors.pth, bin/wcache-convert
#   (only when WCACHE_PYTHON_DIR is set)
#
# Why some files are generated at install time rather than configure time:
# the Makefile configures once (prefix /usr/local by default) and installs
# with `cmake --install --prefix $(PREFIX)`, which changes the prefix after
# configuration. wcache.pc must name the real prefix and the unit must name
# the real path of wcached, so both are written by install(CODE) from the
# prefix in force when installing. The CMake package files compute their
# prefix from their own location and need nothing of the sort.
#
# Directories outside the prefix's usual layout can be chosen when
# configuring: WCACHE_SYSTEMD_UNITDIR, WCACHE_SYSUSERSDIR, WCACHE_TMPFILESDIR
# (relative to the prefix, or absolute; Debian 12 puts units in
# /lib/systemd/system), and WCACHE_PYTHON_DIR for the Python package.
# systemd reads units from /usr/local/lib/systemd/system too, but sysusers.d
# and tmpfiles.d only from /usr/lib, /run and /etc: with PREFIX=/usr/local
# copy those two snippets to /etc/sysusers.d and /etc/tmpfiles.d.
#
# wcached reads /etc/wcached.conf whatever the prefix: the example
# configuration is installed there when no such file exists (never over a
# real one; WCACHE_INSTALL_CONFIG=OFF skips it, as the Debian package, which
# ships /etc/wcached.conf as a conffile, does), and as documentation. Installed as
# root with no DESTDIR, ldconfig runs so that libwcache.so.0 is found at once.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(WCACHE_SYSTEMD_UNITDIR "lib/systemd/system" CACHE STRING
	"systemd system units: relative to the install prefix, or absolute")
set(WCACHE_SYSUSERSDIR "lib/sysusers.d" CACHE STRING
	"systemd sysusers.d snippets: relative to the install prefix, or absolute")
set(WCACHE_TMPFILESDIR "lib/tmpfiles.d" CACHE STRING
	"systemd tmpfiles.d snippets: relative to the install prefix, or absolute")
set(WCACHE_PYTHON_DIR "" CACHE STRING
	"Install the wcache Python package into this directory (relative to the prefix, e.g. lib/python3/dist-packages, or absolute); empty: do not install it")
option(WCACHE_INSTALL_SYSTEMD "Install the systemd units and snippets" ON)

# --- programs and library ----------------------------------------------------

install(TARGETS wcached RUNTIME DESTINATION ${CMAKE_INSTALL_SBINDIR} COMPONENT Runtime)
install(TARGETS wcachectl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT Runtime)

# client/CMakeLists.txt gives wcache its source directory as a PUBLIC include
# directory: right for the build tree, meaningless once installed, and
# install(EXPORT) refuses a source path. Mark every such entry as build-only;
# the installed target gets the include directory instead (INCLUDES below).
get_target_property(_wc_incs wcache INTERFACE_INCLUDE_DIRECTORIES)
if(_wc_incs)
	set(_wc_fixed)
	foreach(_wc_dir IN LISTS _wc_incs)
		if(_wc_dir MATCHES "^\\$<" OR NOT IS_ABSOLUTE "${_wc_dir}")
			list(APPEND _wc_fixed "${_wc_dir}")
		else()
			list(APPEND _wc_fixed "$<BUILD_INTERFACE:${_wc_dir}>")
		endif()
	endforeach()
	set_property(TARGET wcache PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${_wc_fixed}")
endif()

# PUBLIC_HEADER (wcache.h) is relative to client/, but install(TARGETS) here
# would look for it in the root directory: make it absolute.
get_target_property(_wc_clientdir wcache SOURCE_DIR)
get_target_property(_wc_headers wcache PUBLIC_HEADER)
if(_wc_headers)
	set(_wc_fixed)
	foreach(_wc_header IN LISTS _wc_headers)
		if(NOT IS_ABSOLUTE "${_wc_header}")
			set(_wc_header "${_wc_clientdir}/${_wc_header}")
		endif()
		list(APPEND _wc_fixed "${_wc_header}")
	endforeach()
	set_property(TARGET wcache PROPERTY PUBLIC_HEADER "${_wc_fixed}")
endif()

install(TARGETS wcache EXPORT wcacheTargets
	LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
		COMPONENT Library NAMELINK_COMPONENT Development
	PUBLIC_HEADER DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT Development
	INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# Installing as root straight into the system (no DESTDIR, as `sudo make
# install` does): refresh the dynamic loader's cache so that programs and the
# Python package find libwcache.so.0 at once. Staged installs (a DESTDIR, a
# package build) leave that to the package's own triggers.
install(CODE [[
if("$ENV{DESTDIR}" STREQUAL "" AND EXISTS /sbin/ldconfig)
	execute_process(COMMAND id -u OUTPUT_VARIABLE _wc_uid OUTPUT_STRIP_TRAILING_WHITESPACE)
	if(_wc_uid STREQUAL "0")
		message(STATUS "Running ldconfig")
		execute_process(COMMAND /sbin/ldconfig)
	endif()
endif()
]] COMPONENT Library)

# --- CMake package: find_package(wcache) gives wcache::wcache -----------------

set(WCACHE_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/wcache)
install(EXPORT wcacheTargets NAMESPACE wcache:: DESTINATION ${WCACHE_CMAKEDIR}
	COMPONENT Development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/wcacheConfig.cmake.in
	${PROJECT_BINARY_DIR}/cmake/wcacheConfig.cmake
	INSTALL_DESTINATION ${WCACHE_CMAKEDIR}
	PATH_VARS CMAKE_INSTALL_INCLUDEDIR)
# One SOVERSION (0) for all of 0.x: any 0.y satisfies find_package(wcache 0.x).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/wcacheConfigVersion.cmake
	VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/wcacheConfig.cmake
	${PROJECT_BINARY_DIR}/cmake/wcacheConfigVersion.cmake
	DESTINATION ${WCACHE_CMAKEDIR} COMPONENT Development)

# --- files that name the install prefix, written at install time --------------

# Values from configuration time, prepended to each install(CODE) block
# below: those run in cmake_install.cmake, where only CMAKE_INSTALL_PREFIX
# (the prefix of this installation) and DESTDIR are known.
set(_wc_preamble "
set(_wc_srcdir \"${PROJECT_SOURCE_DIR}\")
set(_wc_bindir_gen \"${PROJECT_BINARY_DIR}/install-gen\")
set(_wc_version \"${PROJECT_VERSION}\")
set(_wc_libdir \"${CMAKE_INSTALL_LIBDIR}\")
set(_wc_includedir \"${CMAKE_INSTALL_INCLUDEDIR}\")
set(_wc_sbindir \"${CMAKE_INSTALL_SBINDIR}\")
set(_wc_bindir \"${CMAKE_INSTALL_BINDIR}\")
set(_wc_unitdir \"${WCACHE_SYSTEMD_UNITDIR}\")
set(_wc_sysusersdir \"${WCACHE_SYSUSERSDIR}\")
set(_wc_tmpfilesdir \"${WCACHE_TMPFILESDIR}\")
# _wc_abs(VAR DIR): DIR made absolute against the prefix being installed to.
function(_wc_abs var dir)
	if(IS_ABSOLUTE \"\${dir}\")
		set(\${var} \"\${dir}\" PARENT_SCOPE)
	else()
		set(\${var} \"\${CMAKE_INSTALL_PREFIX}/\${dir}\" PARENT_SCOPE)
	endif()
endfunction()
")

# wcache.pc: prefix is the installation's prefix; libdir and includedir are
# written relative to ${prefix} when they are under it, so that
# PKG_CONFIG_SYSROOT_DIR and pkg-config --define-prefix work.
set(_wc_code [[
set(WCACHE_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
foreach(_wc_kind libdir includedir)
	set(_wc_dir "${_wc_${_wc_kind}}")
	if(IS_ABSOLUTE "${_wc_dir}")
		string(FIND "${_wc_dir}/" "${CMAKE_INSTALL_PREFIX}/" _wc_at)
		if(_wc_at EQUAL 0)
			file(RELATIVE_PATH _wc_dir "${CMAKE_INSTALL_PREFIX}" "${_wc_dir}")
			set(_wc_dir "\${prefix}/${_wc_dir}")
		endif()
	else()
		set(_wc_dir "\${prefix}/${_wc_dir}")
	endif()
	string(TOUPPER "${_wc_kind}" _wc_up)
	set(WCACHE_PC_${_wc_up} "${_wc_dir}")
endforeach()
set(PROJECT_VERSION "${_wc_version}")
configure_file("${_wc_srcdir}/client/lib/wcache.pc.in" "${_wc_bindir_gen}/wcache.pc" @ONLY)
_wc_abs(_wc_pcdir "${_wc_libdir}/pkgconfig")
file(INSTALL DESTINATION "${_wc_pcdir}" TYPE FILE FILES "${_wc_bindir_gen}/wcache.pc")
]])
install(CODE "${_wc_preamble}${_wc_code}" COMPONENT Development)

# The systemd units of systemd/ (found when installing, so units added after
# configuring are installed too), with the path of each Exec*= command of
# wcached or wcachectl replaced by the installed one. A unit may also say
# @sbindir@/wcached and @bindir@/wcachectl. sysusers.d and tmpfiles.d
# snippets: systemd/NAME.sysusers and systemd/NAME.tmpfiles become NAME.conf.
if(WCACHE_INSTALL_SYSTEMD)
	set(_wc_code [[
_wc_abs(_wc_sbin "${_wc_sbindir}")
_wc_abs(_wc_bin "${_wc_bindir}")
_wc_abs(_wc_units "${_wc_unitdir}")
_wc_abs(_wc_sysusers "${_wc_sysusersdir}")
_wc_abs(_wc_tmpfiles "${_wc_tmpfilesdir}")
file(GLOB _wc_unitfiles "${_wc_srcdir}/systemd/*.service" "${_wc_srcdir}/systemd/*.socket")
file(MAKE_DIRECTORY "${_wc_bindir_gen}/systemd")
foreach(_wc_unit IN LISTS _wc_unitfiles)
	get_filename_component(_wc_name "${_wc_unit}" NAME)
	file(READ "${_wc_unit}" _wc_text)
	string(REPLACE "@sbindir@" "${_wc_sbin}" _wc_text "${_wc_text}")
	string(REPLACE "@bindir@" "${_wc_bin}" _wc_text "${_wc_text}")
	# ExecStart=/usr/local/bin/wcached ... (after the optional -@:+! prefixes)
	string(REGEX REPLACE "(Exec[A-Za-z]*=[-@:+!]*)/[^ \t\n]*/wcached([ \t\n])"
		"\\1${_wc_sbin}/wcached\\2" _wc_text "${_wc_text}")
	string(REGEX REPLACE "(Exec[A-Za-z]*=[-@:+!]*)/[^ \t\n]*/wcachectl([ \t\n])"
		"\\1${_wc_bin}/wcachectl\\2" _wc_text "${_wc_text}")
	file(WRITE "${_wc_bindir_gen}/systemd/${_wc_name}" "${_wc_text}")
	file(INSTALL DESTINATION "${_wc_units}" TYPE FILE
		PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ
		FILES "${_wc_bindir_gen}/systemd/${_wc_name}")
endforeach()
foreach(_wc_kind sysusers tmpfiles)
	file(GLOB _wc_snippets "${_wc_srcdir}/systemd/*.${_wc_kind}")
	foreach(_wc_snippet IN LISTS _wc_snippets)
		get_filename_component(_wc_name "${_wc_snippet}" NAME_WE)
		file(INSTALL DESTINATION "${_wc_${_wc_kind}}" TYPE FILE
			PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ
			RENAME "${_wc_name}.conf" FILES "${_wc_snippet}")
	endforeach()
endforeach()
]])
	install(CODE "${_wc_preamble}${_wc_code}" COMPONENT Runtime)
endif()

# --- manual pages, documentation, example configuration ----------------------

install(FILES ${PROJECT_SOURCE_DIR}/man/wcachectl.1
	DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT Runtime)
install(FILES ${PROJECT_SOURCE_DIR}/man/wcached.conf.5
	DESTINATION ${CMAKE_INSTALL_MANDIR}/man5 COMPONENT Runtime)
install(FILES ${PROJECT_SOURCE_DIR}/man/wcached.8
	DESTINATION ${CMAKE_INSTALL_MANDIR}/man8 COMPONENT Runtime)
install(FILES ${PROJECT_SOURCE_DIR}/man/wcache.3
	DESTINATION ${CMAKE_INSTALL_MANDIR}/man3 COMPONENT Development)
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/conf/wcached.conf.example
	DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT Runtime)

# /etc/wcached.conf, which wcached.service names: the example configuration
# when there is none yet, never over an existing one (an upgrade keeps the
# operator's). Always /etc, whatever the prefix, since that is where the
# daemon and its unit look; DESTDIR is honoured. It is left out of
# install_manifest.txt on purpose: removing what was installed must not
# remove a configuration the operator has since edited. Debian's package
# ships its own conffile and turns this off.
option(WCACHE_INSTALL_CONFIG "Install /etc/wcached.conf (the example) when it does not exist" ON)
if(WCACHE_INSTALL_CONFIG)
	set(_wc_code [[
set(_wc_conf "$ENV{DESTDIR}/etc/wcached.conf")
if(EXISTS "${_wc_conf}" OR IS_SYMLINK "${_wc_conf}")
	message(STATUS "Keeping: ${_wc_conf} (exists)")
else()
	message(STATUS "Installing: ${_wc_conf} (from wcached.conf.example)")
	file(MAKE_DIRECTORY "$ENV{DESTDIR}/etc")
	file(COPY "${_wc_example}" DESTINATION "$ENV{DESTDIR}/etc"
		FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
	file(RENAME "$ENV{DESTDIR}/etc/wcached.conf.example" "${_wc_conf}")
endif()
]])
	install(CODE "set(_wc_example \"${PROJECT_SOURCE_DIR}/conf/wcached.conf.example\")
${_wc_code}" COMPONENT Runtime)
endif()

# --- the Python package (pure Python over libwcache.so.0) -------------------

# Besides the package: its dist-info, so importlib.metadata.version("wcache")
# and the console script pyproject.toml declares work as after a pip install
# (the version is read from pyproject.toml, its one definition); the
# wcache-convert script in bin; and wcache-safetensors.pth, which Python runs
# at start-up and which patches an installed safetensors when
# WCACHE_SAFETENSORS=1 (see client/python/wcache/_install.py).
if(WCACHE_PYTHON_DIR)
	set(py_src ${PROJECT_SOURCE_DIR}/client/python)
	install(DIRECTORY ${py_src}/wcache
		DESTINATION ${WCACHE_PYTHON_DIR} COMPONENT Python
		FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
	file(STRINGS ${py_src}/pyproject.toml py_version_line REGEX "^version = ")
	string(REGEX REPLACE "^version = \"([^\"]+)\".*" "\\1" py_version "${py_version_line}")
	file(STRINGS ${py_src}/pyproject.toml py_description_line REGEX "^description = ")
	string(REGEX REPLACE "^description = \"([^\"]+)\".*" "\\1" py_description
		"${py_description_line}")
	string(REPLACE "\\;" ";" py_description "${py_description}")
	set(py_dist ${CMAKE_CURRENT_BINARY_DIR}/python/wcache-${py_version}.dist-info)
	file(WRITE ${py_dist}/METADATA "Metadata-Version: 2.1\nName: wcache\nVersion: ${py_version}\n"
		"Summary: ${py_description}\nRequires-Python: >=3.9\nRequires-Dist: numpy\n"
		"Provides-Extra: torch\nRequires-Dist: torch; extra == \"torch\"\n")
	file(WRITE ${py_dist}/entry_points.txt
		"[console_scripts]\nwcache-convert = wcache.convert:main\n")
	file(WRITE ${py_dist}/top_level.txt "wcache\n")
	file(WRITE ${py_dist}/INSTALLER "cmake\n")
	install(DIRECTORY ${py_dist} DESTINATION ${WCACHE_PYTHON_DIR} COMPONENT Python)
	install(FILES ${py_src}/wcache-safetensors.pth DESTINATION ${WCACHE_PYTHON_DIR}
		COMPONENT Python)
	install(PROGRAMS ${py_src}/wcache-convert DESTINATION ${CMAKE_INSTALL_BINDIR}
		COMPONENT Python)
	install(FILES ${PROJECT_SOURCE_DIR}/man/wcache-convert.1
		DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT Python)
endif()
