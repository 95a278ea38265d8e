use super::*;

fn tuple(cells: &[Option<Option<&str>>]) -> Vec<u8> {
    // None = unchanged, Some(None) = null, Some(Some(t)) = text
    let mut b = (cells.len() as i16).to_be_bytes().to_vec();
    for c in cells {
        match c {
            None => b.push(b'u'),
            Some(None) => b.push(b'n'),
            Some(Some(t)) => {
                b.push(b't');
                b.extend((t.len() as i32).to_be_bytes());
                b.extend(t.as_bytes());
            }
        }
    }
    b
}

#[test]
fn relation_and_changes() {
    let mut m = vec![b'R'];
    m.extend(16384u32.to_be_bytes());
    m.extend(b"public\0t\0");
    m.push(b'd');
    m.extend(2i16.to_be_bytes());
    m.push(1);
    m.extend(b"id\0");
    m.extend(20u32.to_be_bytes());
    m.extend((-1i32).to_be_bytes());
    m.push(0);
    m.extend(b"body\0");
    m.extend(25u32.to_be_bytes());
    m.extend((-1i32).to_be_bytes());
    let Message::Relation(rel) = decode(&m).unwrap() else {
        panic!()
    };
    assert_eq!(rel.name, "t");
    assert!(rel.columns[0].key && !rel.columns[1].key);
    assert_eq!(rel.columns[1].type_oid, 25);

    let mut u = vec![b'U'];
    u.extend(16384u32.to_be_bytes());
    u.push(b'K');
    u.extend(tuple(&[Some(Some("1")), Some(None)]));
    u.push(b'N');
    u.extend(tuple(&[Some(Some("2")), None]));
    assert_eq!(
        decode(&u).unwrap(),
        Message::Update {
            rel: 16384,
            old: Some(OldTuple::Key(vec![Cell::Text("1".into()), Cell::Null])),
            new: vec![Cell::Text("2".into()), Cell::Unchanged],
        }
    );

    let mut t = vec![b'T'];
    t.extend(2u32.to_be_bytes());
    t.push(1);
    t.extend(1u32.to_be_bytes());
    t.extend(2u32.to_be_bytes());
    assert_eq!(
        decode(&t).unwrap(),
        Message::Truncate {
            rels: vec![1, 2],
            cascade: true,
            restart_identity: false
        }
    );
    assert!(decode(&[b'I', 0, 0]).is_err());
}
